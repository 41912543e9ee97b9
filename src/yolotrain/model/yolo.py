"""The YOLOv5 (v6/v7) detector: CSP-Darknet backbone with SPPF, PAN neck, Detect head over 3 (P5) or 4 (P6)
levels, or any architecture written in the reference's model-YAML format."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..detector import Task
from .detect import Detect
from .layered import LayeredDetector
from .spec import (
    HEAD_BLOCKS,
    MAX_CLASSES,
    VERSIONS,
    ModelSpec,
    build_layers,
    builtin_spec,
    matching_version,
    published_variant,
    read_model_yaml,
)

# The tasks a YOLOv5 model serves: those its heads declare.
TASKS: tuple[Task, ...] = tuple(dict.fromkeys(head.task for head in HEAD_BLOCKS.values()))


def parse_version(version: str) -> str:
    """Accept 'n' … 'x', 'n6' … 'x6', 'n-seg' … 'x-seg' or 'yolov5n' … (any case); raise a ValueError naming
    the choices otherwise."""
    key = str(version).lower().removeprefix("yolov5")
    if key not in VERSIONS:
        choices = ", ".join(repr(v) for v in VERSIONS)
        raise ValueError(f"unknown YOLOv5 version {version!r}: choose one of {choices} (or 'yolov5n' ...)")
    return key


def _anchor_tensor(anchors: Sequence[Sequence[float]] | torch.Tensor) -> torch.Tensor:
    """Anchors in pixels as a ``[levels, na, 2]`` tensor; rows of flat (w, h) pairs are accepted (the
    number of levels is checked against the Detect layer when it is built)."""
    table = torch.as_tensor(anchors, dtype=torch.float32)
    if table.ndim == 2 and table.shape[1] % 2 == 0:
        table = table.view(table.shape[0], -1, 2)
    if table.ndim != 3 or table.shape[2] != 2:
        raise ValueError(f"anchors must give (w, h) pairs for each level, got shape {tuple(table.shape)}")
    return table


class Yolov5(LayeredDetector):
    """YOLOv5 detector, or instance segmenter with ``task="segment"`` (the head's task is the model's).

    ``version`` is a published size (``'n'`` … ``'x'``, P5: strides 8, 16, 32; ``'n6'`` … ``'x6'``, P6:
    strides 8, 16, 32, 64; ``'n-seg'`` … ``'x-seg'``, the same as ``task="segment"``) or a
    :class:`ModelSpec` (see :meth:`from_yaml`), whose head (Detect or Segment) gives the task. In
    ``train()`` mode ``model(imgs)`` returns one raw head map ``[B, 3, H/s, W/s, 5+nc]`` per level; in
    ``eval()`` mode decoded boxes ``[B, N, 5+nc]``. A segmentation model (a Segment head) has
    :attr:`num_masks` mask coefficients after the class scores (``5+nc+nm`` per anchor, raw in both
    modes) and returns ``(maps, proto)`` in ``train()`` mode and ``(decoded, proto)`` in ``eval()`` mode,
    ``proto`` being the prototype masks ``[B, nm, H/4, W/4]``. Input sides must be multiples of the
    largest stride.
    ``self.model`` keeps the reference's layer indices, so a reference ``state_dict`` loads unchanged.
    ``version`` is ``'custom'`` for a spec that is not one of the published architectures;
    ``in_channels`` defaults to the spec's ``ch`` (3). It implements :class:`~yolotrain.detector.BoxDetector`
    (any multiple of the largest stride as input size, NMS outside the model); weights files are read by
    :func:`yolotrain.load`.
    """

    task: Task = "detect"

    def __init__(self, version: str | ModelSpec = "s", num_classes: int = 80,
                 anchors: Sequence[Sequence[float]] | torch.Tensor | None = None, in_channels: int | None = None,
                 names: Sequence[str] | None = None, task: Task | None = None) -> None:
        super().__init__()
        if not 1 <= int(num_classes) <= MAX_CLASSES:
            raise ValueError(f"num_classes must be from 1 to {MAX_CLASSES}, got {num_classes}")
        if task is not None and task not in TASKS:
            raise ValueError(f"unknown task {task!r}: choose one of {', '.join(map(repr, TASKS))}")
        if isinstance(version, ModelSpec):
            self.spec = version
            self.version = matching_version(version) or "custom"
        else:
            self.version = parse_version(version)
            if task is not None:
                self.version = published_variant(self.version, task)
            self.spec = builtin_spec(self.version)
        self.num_classes = int(num_classes)
        self.names = [str(n) for n in names] if names is not None else [str(i) for i in range(self.num_classes)]
        if len(self.names) != self.num_classes:
            raise ValueError(f"{len(self.names)} class names for {self.num_classes} classes")
        self.in_channels = int(self.spec.in_channels if in_channels is None else in_channels)
        table = _anchor_tensor(self.spec.anchors if anchors is None else anchors)
        built = build_layers(self.spec, self.num_classes, table, self.in_channels)
        self.model = nn.ModuleList(built.modules)
        self.layer_inputs = built.inputs
        self.saved_outputs = built.saved
        self.max_stride = int(max(max(built.strides), self.head.stride.max().item()))
        self.task: Task = self.head.task
        if task is not None and task != self.task:
            raise ValueError(f"{self.spec.where()} has a {type(self.head).__name__} head, which makes a "
                             f"{self.task} model, not a {task} one")

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, num_classes: int | None = None,
                  names: Sequence[str] | None = None, in_channels: int | None = None) -> Yolov5:
        """Build the architecture of a reference-format model YAML (``nc``, ``depth_multiple``,
        ``width_multiple``, ``anchors``, ``backbone``/``head``); ``num_classes`` overrides its ``nc``.

        Blocks: Conv, C3, SPPF, SPP, Focus, Bottleneck, Concat, nn.Upsample, Detect or Segment (the
        reference's ``models/segment/*.yaml``: a segmentation model). A bad entry raises
        a one-line ValueError naming ``file:line``.
        """
        spec = read_model_yaml(path)
        return cls(spec, num_classes=spec.nc if num_classes is None else num_classes, names=names,
                   in_channels=in_channels)

    @property
    def head(self) -> Detect:
        return self.model[-1]

    @property
    def arch_name(self) -> str:
        """The architecture's name: ``yolov5n``, ``yolov5s6``, ``yolov5s-seg`` (``yolov5custom`` for a YAML's own)."""
        return f"yolov5{self.version}"

    def forward(self, imgs: torch.Tensor) -> Any:
        """Train mode: the raw maps (segmentation: ``(maps, proto)``); eval mode: the decoded predictions
        (segmentation: ``(decoded, proto)``), without autograd decoded from views of the head's outputs into
        one tensor (no copies on the way), with it out of place (differentiable)."""
        if self.training:
            return self.forward_maps(imgs)
        features = self._head_inputs(imgs)
        if torch.is_grad_enabled():
            outputs = self.head(features)
            maps, proto = outputs if self.num_masks else (outputs, None)
            decoded = self.head.decode(maps)
        else:
            decoded = self.head.decode_into_one(self.head.map_views(features))
            proto = self.head.proto(features[0]) if self.num_masks else None
        return decoded if proto is None else (decoded, proto)

    def load_matching(self, state: dict[str, torch.Tensor]) -> list[str]:
        """Copy every tensor of ``state`` whose name and shape this model has (the reference's transfer of
        detection weights into a segmentation model, or into another class count); returns the names of
        this model's tensors left as they were (Proto, for instance).

        Unlike the reference, a Segment head also takes a Detect head's box, objectness and class outputs
        of the same classes (its mask coefficients start fresh), so a segmentation model made from
        detection weights detects as well as they do from its first step."""
        own = self.state_dict()
        matching = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        matching.update(self._detect_rows(state, own))
        self.load_state_dict(matching, strict=False)
        return [k for k in own if k not in matching]

    def _detect_rows(self, state: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The Segment head's convolutions with each anchor's first ``5 + nc`` outputs from a Detect head's."""
        if not self.num_masks:
            return {}
        head, prefix = self.head, f"model.{len(self.model) - 1}.m."
        rows = {}
        for key, value in own.items():
            source = state.get(key)
            if not key.startswith(prefix) or source is None or source.shape[1:] != value.shape[1:] \
                    or source.shape[0] != head.na * (head.no - head.nm):
                continue
            per_anchor = value.view(head.na, head.no, *value.shape[1:])
            detected = source.view(head.na, head.no - head.nm, *value.shape[1:]).to(value.dtype)
            rows[key] = torch.cat((detected, per_anchor[:, detected.shape[1]:]), 1).view_as(value)
        return rows
