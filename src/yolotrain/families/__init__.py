"""The model families (see :mod:`yolotrain.family`): one package per head design, each defining ``FAMILY``."""
