"""Oriented boxes' training: detection's (the anchor-free family's recipe and loss for the task), on DOTA-style
labels read as rotated boxes (targets ``[N, 7]``), with the angle loss's columns and tags and batches drawn as
rotated boxes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2

from ...data.batch import Batch
from ...interop.loading.anchor_free import is_anchor_free_name
from ..detect.train import TAGS as DETECT_TAGS
from ..detect.train import DetectTraining
from .plots import draw_rotated_batch

# results.csv column → TensorBoard tag: detection's, and ultralytics' angle loss.
TAGS = {**DETECT_TAGS, "train_angle": "train/angle_loss", "val_angle": "val/angle_loss"}


class OBBTraining(DetectTraining):
    """Oriented boxes' answers to the engine where they differ from detection's."""

    dataset_kind = "rotated"  # batches of targets [N, 7]: image, class, cx, cy, w, h, angle

    def claims_model_name(self, model: str) -> bool:
        """A published oriented-box architecture (``yolov8n-obb``, ``yolo11s-obb.pt``): a dataset's YAML cannot
        say its labels are rotated boxes, so the model decides, as in Ultralytics."""
        stem = Path(model).name.lower().removesuffix(".pt").removesuffix(".yaml").removesuffix(".yml")
        return stem.endswith("-obb") and is_anchor_free_name(model)

    def save_training_batch(self, path: Path, batch: Batch, names: Sequence[str], config: Any) -> bool:
        """The batch with its rotated boxes (see :func:`~yolotrain.tasks.obb.plots.draw_rotated_batch`)."""
        cv2.imwrite(str(path), draw_rotated_batch(batch.imgs, batch.targets, names))
        return True

    @property
    def logger_tags(self) -> Mapping[str, str]:
        return TAGS
