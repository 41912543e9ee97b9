"""The anchor-free family's classifiers (``yolov8n-cls`` … ``yolov8x-cls``, ``yolo11n-cls`` … ``yolo11x-cls``) as
:class:`~yolotrain.model.classify.Classifier` models: the reference's Classify head is the YOLOv5 one (a 1x1 Conv
to 1280 channels, pooling, dropout, Linear, under the same names), so these need no model class of their own."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..classify import Classifier
from .spec import AnchorFreeSpec, build_layers, builtin_spec, parse_name


def anchor_free_classifier(name: str | AnchorFreeSpec, num_classes: int = 1000,
                           names: Sequence[str] | None = None) -> Classifier:
    """The published classifier ``name`` (``yolov8n-cls``, ``yolo11s-cls`` …) or a spec ending in Classify, with
    random weights and ``num_classes`` outputs; ``model.model`` holds the layers under the reference's names.

    Every BatchNorm keeps PyTorch's defaults (eps 1e-5, momentum 0.1): the reference's classification models,
    unlike its detectors, are never re-initialised with its own, so their checkpoints were trained with these."""
    spec = name if isinstance(name, AnchorFreeSpec) else builtin_spec(parse_name(name))
    if spec.head_block != "Classify":
        raise ValueError(f"{spec.where()} ends in {spec.head_block or 'no head'}, not Classify: not a classifier")
    built = build_layers(spec, num_classes, spec.in_channels)
    if any(source != i - 1 for i, source in enumerate(built.inputs) if i):
        raise ValueError(f"{spec.where()}: a classifier's layers must form one chain (inputs {built.inputs})")
    layers = nn.Sequential(*built.modules)
    for module in layers.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.eps, module.momentum = 1e-5, 0.1
    arch = spec.source if isinstance(name, AnchorFreeSpec) else parse_name(name)
    return Classifier(layers, num_classes, arch, names, in_channels=spec.in_channels)
