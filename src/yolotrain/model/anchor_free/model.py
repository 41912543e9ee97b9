"""The anchor-free YOLO detector, instance segmenter, oriented-box detector and keypoint (pose) model (YOLOv5u,
YOLOv8, YOLO11, or any
architecture written in the reference's anchor-free model-YAML format), with the interface of
:class:`~yolotrain.model.Yolov5`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ...detector import Task
from ..layered import LayeredDetector
from ..spec import MAX_CLASSES
from .head import AnchorFreeDetect
from .spec import AnchorFreeSpec, build_layers, builtin_spec, matching_name, parse_name, read_model_yaml


class AnchorFreeYolo(LayeredDetector):
    """Anchor-free YOLO detector, or instance segmenter when its head is a Segment one (``yolov8n-seg``), oriented-box
    detector when it is an OBB one (``yolov8n-obb``), keypoint model when it is a Pose one (``yolov8n-pose``).

    ``arch`` is a published name (``yolov5nu``, ``yolov5n6u``, ``yolov8n``, ``yolov8n-p6``, ``yolov8n-seg``,
    ``yolo11n``, ``yolo11n-seg``, ``yolov8n-pose``, ``yolo11n-pose``, ``yolov5nu-pose`` …) or an
    :class:`AnchorFreeSpec` (see :meth:`from_yaml`). In ``train()`` mode
    ``model(imgs)`` returns one raw head map ``[B, 4*reg_max + nc, H/s, W/s]`` per level (distance logits, class
    logits); in ``eval()`` mode decoded predictions ``[B, N, 5+nc]`` (cx, cy, w, h in pixels, an objectness of
    1, class scores: the YOLOv5 form, so its NMS, validation and exports apply unchanged). A segmentation model
    has :attr:`num_masks` mask coefficients after the class logits or scores (raw in both modes) and returns
    ``(maps, proto)`` in ``train()`` mode, ``(decoded, proto)`` in ``eval()`` mode, ``proto`` being the prototype
    masks ``[B, nm, H/4, W/4]``. An oriented-box model has one more channel, the rotation: its raw logit in the
    maps, in eval mode the angle in radians after the class scores (``[B, N, 5+nc+1]``, the box's centre and sides
    along its own axes). A pose model's maps end in :attr:`kpt_shape` = (K, D) keypoint values per cell
    (raw offsets in train mode); in ``eval()`` mode its decoded rows end in K keypoints of x, y in pixels (and a
    visibility probability when D == 3): ``[B, N, 5 + nc + K*D]``. ``kpt_shape`` overrides the spec's (the
    published pose models': COCO's 17 keypoints with visibility), as ``num_classes`` overrides its class count.
    Input sides must be multiples of the largest stride.

    ``self.model`` keeps the reference's layer indices, so a reference ``state_dict`` loads unchanged.
    ``version`` is the published name, or ``'custom'`` for a spec that is not one of them.
    """

    task: Task = "detect"

    def __init__(self, arch: str | AnchorFreeSpec = "yolov8n", num_classes: int = 80,
                 names: Sequence[str] | None = None, in_channels: int | None = None,
                 kpt_shape: Sequence[int] | None = None) -> None:
        super().__init__()
        if isinstance(num_classes, bool) or not 1 <= int(num_classes) <= MAX_CLASSES:
            raise ValueError(f"num_classes must be from 1 to {MAX_CLASSES}, got {num_classes}")
        if isinstance(arch, AnchorFreeSpec):
            self.spec = arch
            self.version = matching_name(arch) or "custom"
        else:
            self.version = parse_name(arch)
            self.spec = builtin_spec(self.version)
        if self.spec.head_block not in ("Detect", "Segment", "OBB", "Pose"):
            raise ValueError(f"{self.spec.where()} ends in {self.spec.head_block or 'no head'}, not Detect, "
                             "Segment, OBB or Pose: a classifier is built by anchor_free_classifier")
        if kpt_shape is not None:
            if self.spec.head_block != "Pose":
                raise ValueError(f"kpt_shape is for a Pose head; {self.spec.where()} ends in {self.spec.head_block}")
            self.spec = dataclasses.replace(self.spec, kpt_shape=tuple(int(v) for v in kpt_shape))
        self.num_classes = int(num_classes)
        self.names = [str(n) for n in names] if names is not None else [str(i) for i in range(self.num_classes)]
        if len(self.names) != self.num_classes:
            raise ValueError(f"{len(self.names)} class names for {self.num_classes} classes")
        self.in_channels = int(self.spec.in_channels if in_channels is None else in_channels)
        built = build_layers(self.spec, self.num_classes, self.in_channels)
        self.model = nn.ModuleList(built.modules)
        self.layer_inputs = built.inputs
        self.saved_outputs = built.saved
        self.max_stride = int(max(max(built.strides), self.head.stride.max().item()))
        self.task: Task = self.head.task

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, num_classes: int | None = None, names: Sequence[str] | None = None,
                  in_channels: int | None = None, scale: str | None = None) -> AnchorFreeYolo:
        """Build the architecture of a reference-format model YAML (``nc``, ``scales`` or multiples,
        ``backbone``/``head``) at ``scale`` (else the one its file name says, else its first);
        ``num_classes`` overrides its ``nc``.

        Blocks: Conv, C3, C2, C2f, C3k2, C2PSA, SPPF, Bottleneck, Concat, nn.Upsample, then Detect, Segment,
        OBB or Pose (``[nc, kpt_shape]``, the YAML's ``kpt_shape`` key).
        A bad entry raises a one-line ValueError naming ``file:line``.
        """
        spec = read_model_yaml(path, scale)
        return cls(spec, num_classes=spec.nc if num_classes is None else num_classes, names=names,
                   in_channels=in_channels)

    @property
    def head(self) -> AnchorFreeDetect:
        return self.model[-1]

    @property
    def arch_name(self) -> str:
        """The architecture's name: ``yolov8n``, ``yolo11s-seg``, ``yolov5nu`` (``custom`` for a YAML's own)."""
        return self.version

    @property
    def kpt_shape(self) -> tuple[int, int] | None:
        """(keypoints, values each) a pose model predicts per object; None for a detector or segmenter."""
        return getattr(self.head, "kpt_shape", None)

    def forward(self, imgs: torch.Tensor) -> Any:
        """Train mode: the raw maps (segmentation: ``(maps, proto)``); eval mode: the decoded predictions
        (segmentation: ``(decoded, proto)``)."""
        outputs = self.forward_maps(imgs)
        if self.training:
            return outputs
        if self.num_masks:
            maps, proto = outputs
            return self.head.decode(maps), proto
        return self.head.decode(outputs)

    def load_matching(self, state: dict[str, torch.Tensor]) -> list[str]:
        """Copy every tensor of ``state`` whose name and shape this model has (a YOLOv5 model's backbone and
        neck, ``model.0`` … ``model.23``, into a YOLOv5u one; detection weights into a segmentation model, or
        into another class count); returns the names of this model's tensors left as they were."""
        own = self.state_dict()
        matching = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        self.load_state_dict(matching, strict=False)
        return [k for k in own if k not in matching]
