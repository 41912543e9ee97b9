"""Pose's training: detection's, on a dataset with keypoints (its YAML's ``kpt_shape``), with a pose model whose
keypoints follow the data's, the keypoint loss (the family's), and the keypoint results' columns and tags."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import torch

from ...data.pose import PoseBatch
from ...data.sources import resolve_source
from ...draw import draw_batch
from ...family import family_of, get_family
from ...interop.loading.anchor_free import is_anchor_free_name
from ...model.anchor_free.spec import builtin_spec
from ...settings import ConfigError
from ...yamlio import read_yaml
from ..detect.train import TAGS as DETECT_TAGS
from ..detect.train import DetectTraining

# The model a run on a pose dataset trains when no --model is given: the smallest published pose model whose
# family's recipe (ultralytics') fits, as ultralytics' own pose default (yolo11n-pose) is of the same family.
DEFAULT_MODEL = "yolov8n-pose"
# The family of every pose model (the anchor-free head is the one with a keypoint branch).
POSE_FAMILY = "anchor_free"
# Validation metrics' columns of results.csv: box and keypoint results (the loss parts follow).
RESULT_METRICS = ("precision", "recall", "mAP50", "mAP50-95", "pose_precision", "pose_recall", "pose_mAP50",
                  "pose_mAP50-95")
# results.csv column → TensorBoard tag: detection's, and ultralytics' pose ones (P: keypoints).
TAGS = {**DETECT_TAGS, "train_pose": "train/pose_loss", "train_kobj": "train/kobj_loss",
        "val_pose": "val/pose_loss", "val_kobj": "val/kobj_loss",
        "pose_precision": "metrics/precision(P)", "pose_recall": "metrics/recall(P)",
        "pose_mAP50": "metrics/mAP50(P)", "pose_mAP50-95": "metrics/mAP50-95(P)"}


def is_pose_model_name(model: str) -> bool:
    """Whether ``model`` (any case, ``.yaml``/``.pt`` dropped) names a published pose architecture (yolov8n-pose,
    yolo11s-pose, yolov5nu-pose ...)."""
    if not is_anchor_free_name(model):
        return False
    name = Path(model).name.lower().removesuffix(".yaml").removesuffix(".yml").removesuffix(".pt")
    return builtin_spec(name).head_block == "Pose"


class PoseTraining(DetectTraining):
    """Pose's answers to the engine where they differ from detection's."""

    dataset_kind = "keypoints"  # batches with the rows' keypoints

    def claims_model_name(self, model: str) -> bool:
        return is_pose_model_name(model)

    def claims_dataset(self, path: str) -> bool:
        """A dataset YAML that declares ``kpt_shape`` (its labels hold keypoints)."""
        file = Path(path)
        if file.suffix.lower() not in (".yaml", ".yml") or not file.is_file():
            return False
        try:
            cfg = read_yaml(file)
        except (OSError, ValueError):
            return False  # read and reported when the dataset is loaded
        return isinstance(cfg, dict) and cfg.get("kpt_shape") is not None

    def training_recipe(self, model: str, data: str | None) -> Mapping[str, Any]:
        """The pose family's recipe, and :data:`DEFAULT_MODEL` when no model is given."""
        return {"model": DEFAULT_MODEL, **get_family(POSE_FAMILY).training_recipe(data)}

    def training_model(self, trainer: Any, root: str) -> Any:
        """Detection's model, which must be a pose model, with its keypoint branch remade for the data's
        ``kpt_shape`` when its own differs (the rest of its weights kept)."""
        model = super().training_model(trainer, root)
        if getattr(model, "kpt_shape", None) is None:
            raise ConfigError(f"{trainer.config.model} is not a pose model: a dataset with keypoints (kpt_shape) "
                              f"trains one such as --model {DEFAULT_MODEL}")
        layout = resolve_source(root).keypoint_layout()
        if tuple(model.kpt_shape) != layout.shape:
            names = model.names
            model = family_of(model).with_new_head(model, len(trainer.names), kpt_shape=layout.shape)
            model.names = names
            if trainer.ctx.is_main:
                trainer._log(f"Keypoints: the model's head remade for the data's kpt_shape {list(layout.shape)}")
        return model

    def training_targets(self, batch: PoseBatch, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The ``[N, 6]`` rows and their keypoints ``[N, K, D]`` (x, y normalised, the labels' visibility)."""
        return batch.targets.to(device, non_blocking=True), batch.keypoints.to(device, non_blocking=True)

    def save_training_batch(self, path: Path, batch: PoseBatch, names: Sequence[str], config: Any) -> bool:
        """The batch with its labels' boxes, names and keypoints."""
        cv2.imwrite(str(path), draw_batch(batch.imgs, batch.targets, names, keypoints=batch.keypoints))
        return True

    @property
    def result_columns(self) -> tuple[str, ...]:
        return RESULT_METRICS

    def result_values(self, result: Any) -> dict[str, float]:
        metrics = super().result_values(result)
        keypoints = result.keypoints
        if keypoints is not None:
            metrics.update({"pose_precision": keypoints.mp, "pose_recall": keypoints.mr,
                            "pose_mAP50": keypoints.map50, "pose_mAP50-95": keypoints.map})
        return metrics

    def result_summary(self, result: Any) -> str:
        pose = (f"  pose mAP50 {result.keypoints.map50:.3f}  mAP50-95 {result.keypoints.map:.3f}"
                if result.keypoints is not None else "")
        return super().result_summary(result) + pose

    @property
    def logger_tags(self) -> Mapping[str, str]:
        return TAGS
