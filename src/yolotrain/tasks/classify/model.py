"""Classification's models for the command line and the YOLO object: YOLOv5-cls and torchvision classifiers."""

from __future__ import annotations

from typing import Any

from ...model.classify import Classifier, parse_cls_name


class ClassifyModel:
    """What classification answers about its models."""

    def is_pytorch_model(self, model: Any) -> bool:
        return isinstance(model, Classifier)

    def names_model_yaml(self, stem: str) -> bool:
        # yolov5n-cls.yaml; torchvision architectures have no model YAML.
        return parse_cls_name(stem) is not None
