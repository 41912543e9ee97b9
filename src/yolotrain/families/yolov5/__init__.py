"""YOLOv5's family: anchor boxes fitted by AutoAnchor, :class:`~yolotrain.loss.YoloLoss` (and its segmentation
variant), the published ``yolov5n`` … ``x6`` and ``-seg`` architectures, checkpoints that record the anchors."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch

from ...checkpoint import validate_detector_metadata
from ...family import ModelFamily
from ...interop.loading.hub import SHA256
from ...interop.loading.pretrained import checkpoint_detector
from ...loss import SegmentLoss, YoloLoss
from ...model import Yolov5, parse_version
from ...model.anchors import check_anchors
from ...model.spec import published_head


class Yolov5Family(ModelFamily):
    """YOLOv5's answers to the box tasks."""

    model_class = Yolov5
    name = "yolov5"

    def claims_model_name(self, model: str) -> bool:
        """Every name no other family claims is YOLOv5's: a published size, its YAML, weights files."""
        return True

    def names_model_yaml(self, stem: str, task: str) -> bool:
        try:
            version = parse_version(stem)
        except ValueError:
            return False
        return published_head(version).task == task

    def training_recipe(self, data: str | None) -> Mapping[str, Any]:
        return {}  # the shared defaults are YOLOv5's reference recipe

    def search_limits(self) -> Mapping[str, tuple[float, float]]:
        return {}  # the evolution table is YOLOv5's

    def from_scratch_hint(self, model: str) -> str:
        name = f"yolov5{parse_version(model)}"
        if f"{name}.pt" in SHA256:
            return f"--model {name}.pt starts from the official COCO weights"
        return f"--cfg {name}.yaml --weights {name.removesuffix('-seg')}.pt starts from the detection weights"

    def fit_anchors(self, trainer: Any, model: Yolov5) -> None:
        """AutoAnchor on the training labels; every process computes the same anchors from the seed."""
        cfg = trainer.config
        report = check_anchors(model, trainer.train_set.shapes, trainer.train_set.labels, cfg.data.img_size,
                               cfg.loss.anchor_t, seed=cfg.seed, log=trainer._log if trainer.ctx.is_main else None)
        if trainer.ctx.is_main:
            trainer._log(report.summary())

    def training_loss(self, task: str, config: Any) -> Callable[..., Callable]:
        losses = {"detect": YoloLoss, "segment": partial(SegmentLoss, overlap=config.data.overlap_mask)}
        return losses[task]

    def with_new_head(self, model: Yolov5, num_classes: int) -> Yolov5:
        """Same backbone and neck for another class count; the Detect convolutions start fresh."""
        anchors = model.head.anchors * model.head.stride.view(-1, 1, 1)
        fresh = Yolov5(model.spec, num_classes=num_classes, anchors=anchors, in_channels=model.in_channels)
        head_convs = f"model.{len(model.model) - 1}.m."
        state = {k: v for k, v in model.state_dict().items() if not k.startswith(head_convs)}
        fresh.load_state_dict(state, strict=False)  # same architecture: only the head convolutions are missing
        return fresh

    def raw_export_refusal(self) -> str | None:
        return None  # the runtime decodes the maps with the anchors the metadata carries

    def export_metadata(self, model: Yolov5) -> dict[str, str]:
        head = model.head
        anchors = (head.anchors * head.stride.view(-1, 1, 1)).tolist()
        return {"model": model.arch_name, "nc": str(head.nc), "anchors": json.dumps(anchors),
                "strides": json.dumps([int(s) for s in head.stride.tolist()])}

    def checkpoint_architecture(self, model: Yolov5) -> dict[str, Any]:
        head = model.head
        strides = [float(s) for s in head.stride.tolist()]
        anchors = (head.anchors.detach().cpu().double() * head.stride.cpu().double().view(-1, 1, 1)).tolist()
        architecture = {"version": model.version, "nc": int(head.nc), "anchors": anchors, "strides": strides,
                        "in_channels": int(model.in_channels)}
        if model.version == "custom":  # self-contained: the layers themselves, not a path to their YAML
            architecture.update(cfg=model.spec.to_dict())
        return architecture

    def validate_checkpoint(self, metadata: dict[str, Any], bad: Callable[[str, str], Exception]) -> None:
        validate_detector_metadata(metadata, bad)

    def rebuild_checkpoint(self, metadata: dict[str, Any], state: dict[str, torch.Tensor], source: str) -> Yolov5:
        return checkpoint_detector(metadata, state, source)


FAMILY = Yolov5Family()
