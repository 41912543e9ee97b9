"""Detection's models for the command line and the YOLO object: YOLOv5 with a head that serves detection."""

from __future__ import annotations

from typing import Any

from ...model.spec import published_head
from ...model.yolo import Yolov5, parse_version


class DetectModel:
    """What detection (and segmentation, whose models are YOLOv5's too) answers about its models."""

    name: str

    def is_pytorch_model(self, model: Any) -> bool:
        return isinstance(model, Yolov5)

    def names_model_yaml(self, stem: str) -> bool:
        try:
            version = parse_version(stem)
        except ValueError:
            return False
        return published_head(version).task == self.name
