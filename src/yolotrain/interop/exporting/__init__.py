"""Exporting a model to a deployment format: the command and its settings (:mod:`.exporter`), the export
graph every format is written from (:mod:`.graph`) and the int8 calibration inputs (:mod:`.calibration`).
Each format's own writer is in :mod:`..formats`."""
