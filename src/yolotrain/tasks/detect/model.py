"""Detection's models for the command line and the YOLO object: those of every model family (YOLOv5's and the
anchor-free one) whose head serves detection."""

from __future__ import annotations

from typing import Any

from ...family import family_names, get_family


class DetectModel:
    """What detection (and segmentation, whose models are of the same families) answers about its models."""

    name: str

    def is_pytorch_model(self, model: Any) -> bool:
        return any(get_family(family).owns_model(model) for family in family_names())

    def names_model_yaml(self, stem: str) -> bool:
        return any(get_family(family).names_model_yaml(stem, self.name) for family in family_names())
