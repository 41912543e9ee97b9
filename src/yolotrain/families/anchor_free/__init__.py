"""The anchor-free family (YOLOv5u, YOLOv8, YOLO11): no anchors to fit, the task-aligned CIoU + DFL + BCE loss
(:mod:`yolotrain.loss.anchor_free`), Ultralytics' training recipe, and checkpoints that record the architecture's
name (or its layers) instead of anchors.

Its models give the decoded outputs of YOLOv5's (an objectness of 1 beside the class scores), so detection and
segmentation validate, predict, track and export them through the same code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ...checkpoint import checkpoint_paths
from ...family import ModelFamily
from ...interop.loading.anchor_free import checkpoint_anchor_free, is_anchor_free_name, is_anchor_free_yaml
from ...loss import (
    AnchorFreeLoss,
    AnchorFreeLossConfig,
    AnchorFreeOBBLoss,
    AnchorFreeOBBLossConfig,
    AnchorFreeSegmentLoss,
    LossConfig,
)
from ...loss.anchor_free_pose import AnchorFreePoseLoss, AnchorFreePoseLossConfig
from ...model.anchor_free import AnchorFreeSpec, AnchorFreeYolo, builtin_spec, check_spec
from ...model.anchor_free.pose import KEYPOINT_DIMENSIONS, MAX_KEYPOINTS
from ...model.anchor_free.spec import ARCHITECTURES, PUBLISHED

FAMILY_NAME = "anchor_free"
# Ultralytics' recipe (cfg/default.yaml) where it differs from the shared defaults (YOLOv5's): the loss gains of
# these heads, mosaic off for the last 10 epochs, the optimiser chosen by the run's length (see
# yolotrain.engine.optim.choose_optimizer; Ultralytics 8.4 picks its own MuSGD for long runs, SGD here), and the
# validation NMS IoU of its val (0.7; YOLOv5's is 0.6).
RECIPE = {"loss.box": 7.5, "loss.cls": 0.5, "loss.dfl": 1.5, "augment.close_mosaic": 10, "optim.optimizer": "auto",
          "eval.iou": 0.7}
# Ultralytics' tuner's ranges of those gains (engine/tuner.py): YOLOv5's box limits (0.02-0.2) are 40 times too
# small for the IoU loss normalised by the target scores.
SEARCH_LIMITS = {"box": (1.0, 20.0), "cls": (0.1, 4.0), "dfl": (0.4, 12.0)}
# The head block of each task's published architectures.
HEAD_TASKS = {"detect": "Detect", "segment": "Segment", "classify": "Classify", "obb": "OBB", "pose": "Pose"}


# The run's loss settings each loss configuration takes (the assigner keeps its published settings).
LOSS_GAINS = {AnchorFreeLossConfig: ("box", "cls", "dfl"),
              AnchorFreeOBBLossConfig: ("box", "cls", "dfl", "angle"),
              AnchorFreePoseLossConfig: ("box", "cls", "dfl", "pose", "kobj")}


def loss_config(hyp: LossConfig | Mapping[str, Any] | None,
                config_class: type[AnchorFreeLossConfig] = AnchorFreeLossConfig) -> AnchorFreeLossConfig:
    """The anchor-free loss's gains (a ``config_class``) from a run's loss settings (``box``, ``cls``, ``dfl``; an
    oriented-box loss's ``angle``, a pose loss's ``pose`` and ``kobj`` too)."""
    if hyp is None:
        return config_class()
    values = hyp if isinstance(hyp, Mapping) else vars(hyp)
    return config_class(**{key: values[key] for key in LOSS_GAINS[config_class] if key in values})


def _loss(loss_class: type, model: Any, rect_training: bool = False, img_size: int | None = None,
          hyp: LossConfig | Mapping[str, Any] | None = None,
          config_class: type[AnchorFreeLossConfig] = AnchorFreeLossConfig, **options: Any) -> AnchorFreeLoss:
    return loss_class(model, rect_training=rect_training, img_size=img_size, hyp=loss_config(hyp, config_class),
                      **options)


class AnchorFreeFamily(ModelFamily):
    """The anchor-free family's answers to the box tasks."""

    model_class = AnchorFreeYolo
    name = FAMILY_NAME
    # Their published mAPs are Ultralytics' val's: its matching, PR curve ends and input-pixel comparison.
    scoring = "ultralytics"
    val_iou = predict_iou = 0.7

    def claims_model_name(self, model: str) -> bool:
        """A published name (``yolov8n``, ``yolo11n-seg.yaml``, ``yolov5nu.pt``), an Ultralytics-format model YAML,
        or one of our checkpoints of such a model."""
        path = Path(model)
        if is_anchor_free_name(model):
            return True
        if path.suffix.lower() in (".yaml", ".yml") and path.is_file():
            return is_anchor_free_yaml(path)
        _, json_path, _ = checkpoint_paths(path)
        if json_path.is_file():
            try:
                return json.loads(json_path.read_text(encoding="utf-8")).get("family") == FAMILY_NAME
            except (OSError, ValueError, AttributeError):
                return False  # read and reported when the checkpoint is loaded
        return False

    def names_model_yaml(self, stem: str, task: str) -> bool:
        key = stem.lower()
        if key not in ARCHITECTURES:
            return False
        return task in HEAD_TASKS and builtin_spec(key).head_block == HEAD_TASKS[task]

    def training_recipe(self, data: str | None) -> Mapping[str, Any]:
        return RECIPE

    def search_limits(self) -> Mapping[str, tuple[float, float]]:
        return SEARCH_LIMITS

    def from_scratch_hint(self, model: str) -> str:
        name = Path(model).name.lower().removesuffix(".yaml").removesuffix(".pt")
        if name.startswith("yolov5") and name.endswith("u"):
            return (f"--model {name}.yaml --pretrained {name.removesuffix('u')}.pt starts its backbone and neck from "
                    f"the YOLOv5 weights (the same layers), or --model {name}.pt from Ultralytics' COCO weights")
        return f"--model {name}.pt starts from Ultralytics' COCO weights (put the file in the working folder)"

    def fit_anchors(self, trainer: Any, model: Any) -> None:
        """Nothing to fit: the head predicts distances from each cell's centre."""

    def training_loss(self, task: str, config: Any) -> Callable[..., Callable]:
        losses = {"detect": partial(_loss, AnchorFreeLoss),
                  "segment": partial(_loss, AnchorFreeSegmentLoss, overlap=config.data.overlap_mask),
                  "obb": partial(_loss, AnchorFreeOBBLoss, config_class=AnchorFreeOBBLossConfig),
                  "pose": partial(_loss, AnchorFreePoseLoss, config_class=AnchorFreePoseLossConfig)}
        return losses[task]

    def with_new_head(self, model: AnchorFreeYolo, num_classes: int,
                      kpt_shape: tuple[int, int] | None = None) -> AnchorFreeYolo:
        """Same layers for another class count (a pose model: and another ``kpt_shape``): every tensor but the
        class branch's (the keypoint branch's) last convolutions is kept."""
        fresh = AnchorFreeYolo(model.spec, num_classes=num_classes, in_channels=model.in_channels,
                               kpt_shape=kpt_shape)
        fresh.load_matching(model.state_dict())
        return fresh

    def raw_export_refusal(self) -> str | None:
        return ("--raw exports YOLOv5's anchor-based head maps; an anchor-free model exports its decoded predictions "
                "(boxes, class scores), which every runtime reads")

    def export_metadata(self, model: AnchorFreeYolo) -> dict[str, str]:
        return {"model": model.arch_name, "family": FAMILY_NAME, "nc": str(model.head.nc),
                "reg_max": str(model.head.reg_max), "strides": json.dumps([int(s) for s in model.stride.tolist()])}

    def checkpoint_architecture(self, model: AnchorFreeYolo) -> dict[str, Any]:
        architecture = {"family": FAMILY_NAME, "version": model.version, "nc": int(model.head.nc),
                        "strides": [float(s) for s in model.stride.tolist()], "in_channels": int(model.in_channels)}
        if model.kpt_shape is not None:  # a pose model's keypoints, like its class count, are the data's
            architecture.update(kpt_shape=list(model.kpt_shape))
        if model.version == "custom":  # self-contained: the layers themselves, not a path to their YAML
            architecture.update(cfg=model.spec.to_dict())
        return architecture

    def validate_checkpoint(self, metadata: dict[str, Any], bad: Callable[[str, str], Exception]) -> None:
        version = metadata.get("version")
        if version != "custom" and version not in PUBLISHED:
            raise bad("version", "must be an anchor-free architecture such as 'yolov8n', or 'custom' with a cfg")
        if version == "custom" and "cfg" not in metadata:
            raise bad("cfg", "must hold the layers of a custom architecture")
        strides = metadata.get("strides")
        if not (isinstance(strides, list) and 1 <= len(strides) <= 8
                and all(isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0 for s in strides)):
            raise bad("strides", "must be a list of 1 to 8 positive numbers")
        kpt_shape = metadata.get("kpt_shape")
        if kpt_shape is not None and not (isinstance(kpt_shape, list) and len(kpt_shape) == 2
                                          and all(type(v) is int for v in kpt_shape)
                                          and 1 <= kpt_shape[0] <= MAX_KEYPOINTS
                                          and kpt_shape[1] in KEYPOINT_DIMENSIONS):
            raise bad("kpt_shape", f"must be [keypoints 1..{MAX_KEYPOINTS}, 2 or 3 values each], "
                      f"got {str(kpt_shape)[:40]}")
        in_channels = metadata.get("in_channels", 3)
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or not 1 <= in_channels <= 64:
            raise bad("in_channels", f"must be an integer from 1 to 64, got {str(in_channels)[:40]}")
        if "cfg" in metadata:  # its layers are checked as a model YAML's are, nothing allocated
            try:
                check_spec(AnchorFreeSpec.from_mapping(metadata["cfg"], "cfg"), metadata["nc"], in_channels)
            except (TypeError, ValueError) as exc:
                raise bad("cfg", f"is not a valid architecture ({str(exc)[:300]})") from None

    def rebuild_checkpoint(self, metadata: dict[str, Any], state: dict[str, torch.Tensor],
                           source: str) -> AnchorFreeYolo:
        return checkpoint_anchor_free(metadata, state, source)


FAMILY = AnchorFreeFamily()
