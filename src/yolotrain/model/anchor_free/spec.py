"""Anchor-free architectures in the reference's (ultralytics') model-YAML format, and their translation into layers.

A spec is what an ultralytics ``yolov8.yaml`` holds: ``nc``, ``scales`` (``{n: [depth, width, max_channels], ...}``,
one of which is chosen) or plain ``depth_multiple``/``width_multiple``, ``kpt_shape`` for a pose model, and the
``backbone``/``head`` lists of ``[from, number, module, args]`` entries. The published YOLOv5u, YOLOv8 and YOLO11
architectures (detection, segmentation, classification, pose; P6 where the reference has them) are such specs, kept
below as the reference's YAML entries, and YOLOv5u with the Pose head (``yolov5nu-pose``). :func:`build_layers`
turns a spec into modules exactly as the reference's ``parse_model`` does: channels ``ceil(min(c, max_channels) *
width / 8) * 8``, repeats ``round(n * depth)``, C3k2's C3k blocks forced on for the m, l and x scales, and YOLO11's
depthwise class branch (the reference's ``legacy=False``) once a C3k2 appears. A user's YAML is read with each
entry's line number, so a bad entry is reported as ``file:line: ...``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...messages import brief
from ..blocks import C3, SPPF, Concat, Conv
from ..classify import Classify
from ..spec import (
    MAX_CHANNELS,
    MAX_CLASSES,
    MAX_IN_CHANNELS,
    MAX_KERNEL,
    MAX_LAYERS,
    MAX_MASKS,
    MAX_MULTIPLE,
    MAX_PARAMETERS,
    MAX_REPEATS,
    MAX_UPSAMPLE,
    P5_BACKBONE,
    P5_HEAD,
    P6_BACKBONE,
    P6_HEAD,
    BuiltLayers,
    check_conv_args,
    is_int_in,
    normalise_entry,
    read_yaml_with_lines,
    resolve_inputs,
)
from .blocks import C2, C2PSA, Bottleneck, C2f, C3k2
from .head import REG_MAX, AnchorFreeDetect
from .obb import NUM_ANGLES, AnchorFreeOBB
from .pose import COCO_KEYPOINT_SHAPE, MAX_KEYPOINTS, AnchorFreePose
from .segment import NUM_MASKS, NUM_PROTOS, AnchorFreeSegment

# Entries are [from, number, module, args]; "nc" in args stands for the spec's class count.
Entry = list[Any]
# Scale name → (depth multiple, width multiple, max channels).
Scales = dict[str, tuple[float, float, int]]

SCALE_NAMES = ("n", "s", "m", "l", "x")

# The reference's cfg/models/v5/yolov5.yaml (YOLOv5u: the YOLOv5 v6.0 backbone and neck, anchor-free head).
V5U_SCALES: Scales = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 1024),
                      "l": (1.00, 1.00, 1024), "x": (1.33, 1.25, 1024)}
# YOLOv5's own backbone and neck (the same layers, so a YOLOv5 checkpoint's tensors fit them), the anchor-free head.
V5U_BACKBONE: tuple[Entry, ...] = P5_BACKBONE
V5U_HEAD: tuple[Entry, ...] = (*P5_HEAD[:-1], [[17, 20, 23], 1, "Detect", ["nc"]])

# The reference's cfg/models/v5/yolov5-p6.yaml: one more backbone stage (P6/64), four detection levels.
V5U_P6_BACKBONE: tuple[Entry, ...] = P6_BACKBONE
V5U_P6_HEAD: tuple[Entry, ...] = (*P6_HEAD[:-1], [[23, 26, 29, 32], 1, "Detect", ["nc"]])

# The reference's cfg/models/v8/yolov8.yaml (its -seg.yaml has the same scales and layers, a Segment head).
V8_SCALES: Scales = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 768),
                     "l": (1.00, 1.00, 512), "x": (1.00, 1.25, 512)}
V8_BACKBONE: tuple[Entry, ...] = (
    [-1, 1, "Conv", [64, 3, 2]],  # 0 P1/2
    [-1, 1, "Conv", [128, 3, 2]],  # 1 P2/4
    [-1, 3, "C2f", [128, True]],
    [-1, 1, "Conv", [256, 3, 2]],  # 3 P3/8
    [-1, 6, "C2f", [256, True]],
    [-1, 1, "Conv", [512, 3, 2]],  # 5 P4/16
    [-1, 6, "C2f", [512, True]],
    [-1, 1, "Conv", [1024, 3, 2]],  # 7 P5/32
    [-1, 3, "C2f", [1024, True]],
    [-1, 1, "SPPF", [1024, 5]],  # 9
)
V8_HEAD: tuple[Entry, ...] = (
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 6], 1, "Concat", [1]],  # cat backbone P4
    [-1, 3, "C2f", [512]],  # 12
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 4], 1, "Concat", [1]],  # cat backbone P3
    [-1, 3, "C2f", [256]],  # 15 (P3/8 small)
    [-1, 1, "Conv", [256, 3, 2]],
    [[-1, 12], 1, "Concat", [1]],  # cat head P4
    [-1, 3, "C2f", [512]],  # 18 (P4/16 medium)
    [-1, 1, "Conv", [512, 3, 2]],
    [[-1, 9], 1, "Concat", [1]],  # cat head P5
    [-1, 3, "C2f", [1024]],  # 21 (P5/32 large)
    [[15, 18, 21], 1, "Detect", ["nc"]],
)

# The reference's cfg/models/v8/yolov8-p6.yaml (and -seg-p6.yaml: a Segment head): C2 blocks in the neck.
V8_P6_BACKBONE: tuple[Entry, ...] = (
    [-1, 1, "Conv", [64, 3, 2]],  # 0 P1/2
    [-1, 1, "Conv", [128, 3, 2]],  # 1 P2/4
    [-1, 3, "C2f", [128, True]],
    [-1, 1, "Conv", [256, 3, 2]],  # 3 P3/8
    [-1, 6, "C2f", [256, True]],
    [-1, 1, "Conv", [512, 3, 2]],  # 5 P4/16
    [-1, 6, "C2f", [512, True]],
    [-1, 1, "Conv", [768, 3, 2]],  # 7 P5/32
    [-1, 3, "C2f", [768, True]],
    [-1, 1, "Conv", [1024, 3, 2]],  # 9 P6/64
    [-1, 3, "C2f", [1024, True]],
    [-1, 1, "SPPF", [1024, 5]],  # 11
)
V8_P6_HEAD: tuple[Entry, ...] = (
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 8], 1, "Concat", [1]],  # cat backbone P5
    [-1, 3, "C2", [768, False]],  # 14
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 6], 1, "Concat", [1]],  # cat backbone P4
    [-1, 3, "C2", [512, False]],  # 17
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 4], 1, "Concat", [1]],  # cat backbone P3
    [-1, 3, "C2", [256, False]],  # 20 (P3/8 small)
    [-1, 1, "Conv", [256, 3, 2]],
    [[-1, 17], 1, "Concat", [1]],  # cat head P4
    [-1, 3, "C2", [512, False]],  # 23 (P4/16 medium)
    [-1, 1, "Conv", [512, 3, 2]],
    [[-1, 14], 1, "Concat", [1]],  # cat head P5
    [-1, 3, "C2", [768, False]],  # 26 (P5/32 large)
    [-1, 1, "Conv", [768, 3, 2]],
    [[-1, 11], 1, "Concat", [1]],  # cat head P6
    [-1, 3, "C2", [1024, False]],  # 29 (P6/64 xlarge)
    [[20, 23, 26, 29], 1, "Detect", ["nc"]],
)

# The reference's cfg/models/v8/yolov8-cls.yaml: the YOLOv8 backbone without SPPF, then Classify.
V8_CLS_SCALES: Scales = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 1024),
                         "l": (1.00, 1.00, 1024), "x": (1.00, 1.25, 1024)}
CLASSIFY_HEAD: tuple[Entry, ...] = ([-1, 1, "Classify", ["nc"]],)

# The reference's cfg/models/11/yolo11.yaml (its -seg.yaml: a Segment head; -cls.yaml: see below).
V11_SCALES: Scales = {"n": (0.50, 0.25, 1024), "s": (0.50, 0.50, 1024), "m": (0.50, 1.00, 512),
                      "l": (1.00, 1.00, 512), "x": (1.00, 1.50, 512)}
V11_BACKBONE: tuple[Entry, ...] = (
    [-1, 1, "Conv", [64, 3, 2]],  # 0 P1/2
    [-1, 1, "Conv", [128, 3, 2]],  # 1 P2/4
    [-1, 2, "C3k2", [256, False, 0.25]],
    [-1, 1, "Conv", [256, 3, 2]],  # 3 P3/8
    [-1, 2, "C3k2", [512, False, 0.25]],
    [-1, 1, "Conv", [512, 3, 2]],  # 5 P4/16
    [-1, 2, "C3k2", [512, True]],
    [-1, 1, "Conv", [1024, 3, 2]],  # 7 P5/32
    [-1, 2, "C3k2", [1024, True]],
    [-1, 1, "SPPF", [1024, 5]],  # 9
    [-1, 2, "C2PSA", [1024]],  # 10
)
V11_HEAD: tuple[Entry, ...] = (
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 6], 1, "Concat", [1]],  # cat backbone P4
    [-1, 2, "C3k2", [512, False]],  # 13
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 4], 1, "Concat", [1]],  # cat backbone P3
    [-1, 2, "C3k2", [256, False]],  # 16 (P3/8 small)
    [-1, 1, "Conv", [256, 3, 2]],
    [[-1, 13], 1, "Concat", [1]],  # cat head P4
    [-1, 2, "C3k2", [512, False]],  # 19 (P4/16 medium)
    [-1, 1, "Conv", [512, 3, 2]],
    [[-1, 10], 1, "Concat", [1]],  # cat head P5
    [-1, 2, "C3k2", [1024, True]],  # 22 (P5/32 large)
    [[16, 19, 22], 1, "Detect", ["nc"]],
)
# The reference's cfg/models/11/yolo11-cls.yaml: the YOLO11 backbone with C2PSA in place of SPPF, then Classify.
V11_CLS_BACKBONE: tuple[Entry, ...] = (*V11_BACKBONE[:9], [-1, 2, "C2PSA", [1024]])

SEGMENT_ARGS = ["nc", NUM_MASKS, NUM_PROTOS]
OBB_ARGS = ["nc", NUM_ANGLES]
POSE_ARGS = ["nc", "kpt_shape"]


def _segment_head(head: Sequence[Entry]) -> tuple[Entry, ...]:
    """``head`` with its Detect entry made a Segment one on the same levels (the references' -seg YAMLs)."""
    return (*head[:-1], [head[-1][0], 1, "Segment", SEGMENT_ARGS])


def _obb_head(head: Sequence[Entry]) -> tuple[Entry, ...]:
    """``head`` with its Detect entry made an OBB one on the same levels (the references' -obb YAMLs)."""
    return (*head[:-1], [head[-1][0], 1, "OBB", OBB_ARGS])
def _pose_head(head: Sequence[Entry]) -> tuple[Entry, ...]:
    """``head`` with its Detect entry made a Pose one on the same levels (the references' -pose YAMLs)."""
    return (*head[:-1], [head[-1][0], 1, "Pose", POSE_ARGS])


@dataclass(frozen=True)
class Layout:
    """One of the reference's model YAMLs: its scales and layer entries."""

    scales: Scales
    backbone: tuple[Entry, ...]
    head: tuple[Entry, ...]


LAYOUTS: dict[str, Layout] = {
    "yolov5u": Layout(V5U_SCALES, V5U_BACKBONE, V5U_HEAD),
    "yolov5u-p6": Layout(V5U_SCALES, V5U_P6_BACKBONE, V5U_P6_HEAD),
    # Not one of the reference's: YOLOv5u's backbone and neck with the OBB head of its -obb YAMLs.
    "yolov5u-obb": Layout(V5U_SCALES, V5U_BACKBONE, _obb_head(V5U_HEAD)),
    # Not one of the reference's YAMLs: YOLOv5u's backbone and neck with the reference's Pose head.
    "yolov5u-pose": Layout(V5U_SCALES, V5U_BACKBONE, _pose_head(V5U_HEAD)),
    "yolov8": Layout(V8_SCALES, V8_BACKBONE, V8_HEAD),
    "yolov8-p6": Layout(V8_SCALES, V8_P6_BACKBONE, V8_P6_HEAD),
    "yolov8-seg": Layout(V8_SCALES, V8_BACKBONE, _segment_head(V8_HEAD)),
    "yolov8-seg-p6": Layout(V8_SCALES, V8_P6_BACKBONE, _segment_head(V8_P6_HEAD)),
    "yolov8-obb": Layout(V8_SCALES, V8_BACKBONE, _obb_head(V8_HEAD)),
    "yolov8-cls": Layout(V8_CLS_SCALES, V8_BACKBONE[:9], CLASSIFY_HEAD),
    "yolov8-pose": Layout(V8_SCALES, V8_BACKBONE, _pose_head(V8_HEAD)),
    "yolov8-pose-p6": Layout(V8_SCALES, V8_P6_BACKBONE, _pose_head(V8_P6_HEAD)),
    "yolo11": Layout(V11_SCALES, V11_BACKBONE, V11_HEAD),
    "yolo11-seg": Layout(V11_SCALES, V11_BACKBONE, _segment_head(V11_HEAD)),
    "yolo11-obb": Layout(V11_SCALES, V11_BACKBONE, _obb_head(V11_HEAD)),
    "yolo11-pose": Layout(V11_SCALES, V11_BACKBONE, _pose_head(V11_HEAD)),
    "yolo11-cls": Layout(V11_SCALES, V11_CLS_BACKBONE, CLASSIFY_HEAD),
}


def _published_names() -> dict[str, tuple[str, str]]:
    """Published name → (layout, scale), named as the reference names its weights (``yolov5nu``,
    ``yolov5n6u``, ``yolov8n``, ``yolov8n-p6``, ``yolov8n-seg``, ``yolov8n-seg-p6``, ``yolov8n-obb``,
    ``yolov8n-cls``, ``yolov8n-pose``, ``yolov8n-pose-p6``, ``yolo11n``, ``yolo11n-seg``, ``yolo11n-obb``,
    ``yolo11n-cls``, ``yolo11n-pose``; and ``yolov5nu-obb``, ``yolov5nu-pose`` for YOLOv5u with those heads)."""
    names = {}
    for scale in SCALE_NAMES:
        names[f"yolov5{scale}u"] = ("yolov5u", scale)
        names[f"yolov5{scale}6u"] = ("yolov5u-p6", scale)
        names[f"yolov5{scale}u-obb"] = ("yolov5u-obb", scale)
        names[f"yolov5{scale}u-pose"] = ("yolov5u-pose", scale)
        for layout in LAYOUTS:
            for family in ("yolov8", "yolo11"):
                if layout.startswith(family):
                    names[f"{family}{scale}{layout.removeprefix(family)}"] = (layout, scale)
    return names


PUBLISHED: dict[str, tuple[str, str]] = _published_names()
ARCHITECTURES: tuple[str, ...] = tuple(PUBLISHED)

# The blocks a spec may name; the heads (the last layer of every architecture) by block name.
BLOCKS = ("Conv", "C3", "C2", "C2f", "C3k2", "C2PSA", "SPPF", "Bottleneck", "Concat", "nn.Upsample",
          "Detect", "Segment", "OBB", "Pose", "Classify")
HEAD_BLOCKS: dict[str, type[nn.Module]] = {"Detect": AnchorFreeDetect, "Segment": AnchorFreeSegment,
                                           "OBB": AnchorFreeOBB, "Pose": AnchorFreePose, "Classify": Classify}
# Blocks whose first argument is an output channel count scaled by the width (Classify's is the class count),
# with the most arguments each takes after it here.
_CHANNEL_BLOCKS: dict[str, int] = {"Conv": 4, "C3": 1, "C2": 1, "C2f": 1, "C3k2": 2, "C2PSA": 1, "SPPF": 1,
                                   "Bottleneck": 1}
# Blocks that take the repeat count themselves (the reference's repeat_modules) rather than being repeated.
_DEPTH_BLOCKS = ("C3", "C2", "C2f", "C3k2", "C2PSA")
# The scales on which the reference builds every C3k2 with C3k blocks, whatever the YAML says.
C3K_SCALES = ("m", "l", "x")
MAX_REG_MAX = 64
_SCALE_PATTERN = re.compile(r"yolo(e-)?v?\d+([nslmx])")


@dataclass
class AnchorFreeSpec:
    """One anchor-free architecture in the reference's model-YAML terms, at one scale (``scale`` names it,
    None for a YAML of plain multiples; ``max_channels`` None: unbounded). ``kpt_shape`` (keypoints, values
    each) is what a Pose head predicts (None in a YAML without it). ``source`` and ``lines`` only name errors."""

    depth_multiple: float
    width_multiple: float
    max_channels: int | None
    backbone: list[Entry]
    head: list[Entry]
    scale: str | None = None
    nc: int = 80
    reg_max: int = REG_MAX
    in_channels: int = 3
    source: str = "model spec"
    lines: list[int] | None = field(default=None, compare=False, repr=False)
    kpt_shape: tuple[int, int] | None = None

    @property
    def layers(self) -> list[Entry]:
        return [*self.backbone, *self.head]

    @property
    def head_block(self) -> str:
        """The last entry's block name (Detect, Segment, OBB, Pose or Classify)."""
        last = self.layers[-1]
        return last[2] if isinstance(last, list) and len(last) == 4 else ""

    def where(self, index: int | None = None) -> str:
        """``file:line`` of a layer entry (or of the file), for error messages."""
        if index is not None and self.lines is not None and index < len(self.lines):
            return f"{self.source}:{self.lines[index]}"
        return self.source if index is None else f"{self.source}: layer {index}"

    def layout(self) -> str:
        """The architecture as a canonical string: what builds the layers, except ``nc``, ``kpt_shape`` and the
        channels (what the data decide)."""
        return json.dumps([self.depth_multiple, self.width_multiple, self.max_channels, self.scale in C3K_SCALES,
                           self.reg_max, self.layers])

    def to_dict(self) -> dict[str, Any]:
        """The spec as a reference model-YAML mapping (JSON-serialisable): one scale, or plain multiples."""
        cfg: dict[str, Any] = {"nc": self.nc, "reg_max": self.reg_max, "channels": self.in_channels}
        if self.kpt_shape is not None:
            cfg["kpt_shape"] = list(self.kpt_shape)
        if self.scale is not None:
            cfg["scales"] = {self.scale: [self.depth_multiple, self.width_multiple, self.max_channels]}
        else:
            cfg.update(depth_multiple=self.depth_multiple, width_multiple=self.width_multiple)
        return {**cfg, "backbone": self.backbone, "head": self.head}

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any], source: str = "model spec", lines: Mapping[str, Any] | None = None,
                     scale: str | None = None) -> AnchorFreeSpec:
        """A spec from a reference model-YAML mapping at ``scale`` (else the mapping's ``scale``, else its first
        scale, as the reference picks); ``lines`` (from :func:`read_model_yaml`) locates errors."""
        lines = lines or {}
        where = (lambda key: f"{source}:{lines[key]}" if key in lines else source)  # noqa: E731
        if not isinstance(cfg, Mapping):
            raise ValueError(f"{source}: a model YAML must be a mapping with backbone and head lists")
        for key in ("backbone", "head"):
            if key not in cfg:
                raise ValueError(f"{source}: no '{key}' entry")
        kpt_shape = cfg.get("kpt_shape")
        if kpt_shape is not None:
            if not (isinstance(kpt_shape, (list, tuple)) and len(kpt_shape) == 2
                    and is_int_in(kpt_shape[0], 1, MAX_KEYPOINTS) and is_int_in(kpt_shape[1], 2, 3)):
                raise ValueError(f"{where('kpt_shape')}: kpt_shape must be [keypoints 1..{MAX_KEYPOINTS}, 2 or 3 "
                                 f"values each], got {brief(kpt_shape)}")
            kpt_shape = (int(kpt_shape[0]), int(kpt_shape[1]))
        if "activation" in cfg:
            raise ValueError(f"{where('activation')}: 'activation' is not supported (every Conv uses SiLU)")
        if cfg.get("end2end"):
            raise ValueError(f"{where('end2end')}: end2end (NMS-free one-to-one) heads are not supported")
        depth, width, max_channels, scale = _multiples(cfg, scale, where)
        nc = cfg.get("nc", 80)
        if not is_int_in(nc, 1, MAX_CLASSES):
            raise ValueError(f"{where('nc')}: nc must be an integer from 1 to {MAX_CLASSES}, got {brief(nc)}")
        reg_max = cfg.get("reg_max", REG_MAX)
        if not is_int_in(reg_max, 1, MAX_REG_MAX):
            raise ValueError(f"{where('reg_max')}: reg_max must be an integer from 1 to {MAX_REG_MAX}, "
                             f"got {brief(reg_max)}")
        channel_key = "channels" if "channels" in cfg else "ch"
        in_channels = cfg.get(channel_key, 3)
        if not is_int_in(in_channels, 1, MAX_IN_CHANNELS):
            raise ValueError(f"{where(channel_key)}: {channel_key} must be an integer from 1 to {MAX_IN_CHANNELS}, "
                             f"got {brief(in_channels)}")
        parts = []
        for key in ("backbone", "head"):
            entries = cfg[key]
            if not isinstance(entries, list) or not 0 < len(entries) <= MAX_LAYERS:
                raise ValueError(f"{where(key)}: {key} must be a list of 1 to {MAX_LAYERS} [from, number, module, "
                                 "args] entries")
            parts.append([normalise_entry(e) for e in entries])
        entry_lines = [*lines.get("backbone_entries", []), *lines.get("head_entries", [])] or None
        return cls(depth, width, max_channels, parts[0], parts[1], scale, nc, reg_max, in_channels, source,
                   entry_lines, kpt_shape=kpt_shape)


def _multiples(cfg: Mapping[str, Any], scale: str | None, where: Any) -> tuple[float, float, int | None, str | None]:
    """(depth, width, max channels, scale) of a model-YAML mapping: its ``scales`` row for ``scale`` (or for
    its ``scale`` key, or its first row), else ``depth_multiple``/``width_multiple`` (1.0 when absent)."""
    scales = cfg.get("scales")
    if scales is None:
        multiples = []
        for key in ("depth_multiple", "width_multiple"):
            value = cfg.get(key, 1.0)
            if not _is_number_in(value, MAX_MULTIPLE):
                raise ValueError(f"{where(key)}: {key} must be a positive number up to {MAX_MULTIPLE:g}, "
                                 f"got {brief(value)}")
            multiples.append(float(value))
        return multiples[0], multiples[1], None, None
    if not isinstance(scales, Mapping) or not scales or not all(isinstance(k, str) for k in scales):
        raise ValueError(f"{where('scales')}: scales must map scale names to [depth, width, max_channels], "
                         f"got {brief(scales)}")
    scale = scale or cfg.get("scale") or next(iter(scales))
    if scale not in scales:
        raise ValueError(f"{where('scales')}: no scale {scale!r} (the YAML has {', '.join(map(repr, scales))})")
    row = scales[scale]
    if not (isinstance(row, list) and len(row) == 3 and _is_number_in(row[0], MAX_MULTIPLE)
            and _is_number_in(row[1], MAX_MULTIPLE) and is_int_in(row[2], 1, MAX_CHANNELS)):
        raise ValueError(f"{where('scales')}: scale {scale!r} must be [depth, width, max_channels] (multiples up to "
                         f"{MAX_MULTIPLE:g}, channels up to {MAX_CHANNELS}), got {brief(row)}")
    return float(row[0]), float(row[1]), int(row[2]), scale


def parse_name(name: str) -> str:
    """A published architecture's name in its normal form (any case, ``.yaml`` dropped); a ValueError naming
    the families otherwise."""
    key = str(name).lower().removesuffix(".yaml")
    if key not in PUBLISHED:
        raise ValueError(f"unknown anchor-free architecture {name!r}: choose yolov5nu … yolov5xu (-obb, -pose), "
                         "yolov5n6u …, yolov8n … yolov8x (-p6, -seg, -seg-p6, -obb, -cls, -pose, -pose-p6) or "
                         "yolo11n … yolo11x (-seg, -obb, -cls, -pose)")
    return key


def builtin_spec(name: str) -> AnchorFreeSpec:
    """The published architecture ``name`` (``yolov8n``, ``yolo11s-seg``, ``yolov5nu`` ...)."""
    key = parse_name(name)
    layout_name, scale = PUBLISHED[key]
    layout = LAYOUTS[layout_name]
    depth, width, max_channels = layout.scales[scale]
    head_block = layout.head[-1][2]
    # ImageNet's classes, COCO's persons and their keypoints, COCO's classes.
    nc = {"Classify": 1000, "Pose": 1}.get(head_block, 80)
    kpt_shape = COCO_KEYPOINT_SHAPE if head_block == "Pose" else None
    return AnchorFreeSpec(depth, width, max_channels, [list(e) for e in layout.backbone],
                          [list(e) for e in layout.head], scale, nc=nc, source=key, kpt_shape=kpt_shape)


@functools.cache
def _published_layouts() -> dict[str, str]:
    return {name: builtin_spec(name).layout() for name in PUBLISHED}


def matching_name(spec: AnchorFreeSpec) -> str | None:
    """The published architecture whose scale and layers ``spec`` repeats (None for a custom one)."""
    layout = spec.layout()
    return next((name for name, known in _published_layouts().items() if known == layout), None)


def read_model_yaml(path: str | os.PathLike, scale: str | None = None) -> AnchorFreeSpec:
    """Read a reference-format model YAML at ``scale`` (else the scale its file name says, ``yolov8s.yaml``:
    ``s``, as the reference guesses it, else its first), remembering each entry's line for error messages."""
    source = os.fspath(path)
    cfg, lines = read_yaml_with_lines(source)
    if scale is None and isinstance(cfg, Mapping) and isinstance(cfg.get("scales"), Mapping):
        guessed = _SCALE_PATTERN.search(Path(source).stem)
        scale = guessed.group(2) if guessed and guessed.group(2) in cfg["scales"] else None
    return AnchorFreeSpec.from_mapping(cfg, source, lines, scale)


def _is_number_in(value: Any, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= high


def build_layers(spec: AnchorFreeSpec, nc: int, in_channels: int, build: bool = True) -> BuiltLayers:
    """The reference's ``parse_model`` on ``spec``: one module per entry, the head (Detect, Segment, OBB or Classify)
    last. Every entry is checked first (bounds, arguments, inputs) and each block built without memory to count
    the model's parameters; with ``build=False`` every layer stays on the "meta" device (a check, or a parameter
    count, that allocates nothing)."""
    entries = spec.layers
    legacy = "C3k2" not in (entry[2] for entry in entries if isinstance(entry, list) and len(entry) == 4)
    channels: list[int] = []
    strides: list[float] = []
    modules: list[nn.Module] = []
    inputs: list[int | list[int]] = []
    saved: set[int] = set()
    parameters = 0
    for i, entry in enumerate(entries):
        where = spec.where(i)
        if not isinstance(entry, list) or len(entry) != 4:
            raise ValueError(f"{where}: a layer must be [from, number, module, args], got {brief(entry)}")
        source, number, name, args = entry
        if name not in BLOCKS:
            raise ValueError(f"{where}: unknown block {brief(name)} (supported: {', '.join(BLOCKS)})")
        if not isinstance(args, list):
            raise ValueError(f"{where}: args of {name} must be a list, got {brief(args)}")
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ValueError(f"{where}: number must be a positive integer, got {brief(number)}")
        resolved = resolve_inputs(source, i, where)
        takes_list = name in ("Concat", "Detect", "Segment", "OBB", "Pose")
        if takes_list != isinstance(resolved, list):
            expected = "a list of layers" if takes_list else "one layer"
            raise ValueError(f"{where}: {name} takes its input from {expected}, got from={brief(source)}")
        if name in HEAD_BLOCKS and i != len(entries) - 1:
            raise ValueError(f"{where}: {name} must be the last layer")
        if i == 0:
            c_in, s_in = in_channels, 1.0
        else:
            c_in, s_in = (channels[resolved], strides[resolved]) if isinstance(resolved, int) else (0, 0.0)
        repeats = max(round(number * spec.depth_multiple), 1) if number > 1 else number
        if repeats > MAX_REPEATS:
            raise ValueError(f"{where}: number {number} x depth {spec.depth_multiple:g} gives {repeats} "
                             f"repeats of {name}, more than {MAX_REPEATS}")
        make = functools.partial(_make_block, name, args, c_in, s_in, repeats, resolved, channels, strides, spec,
                                 nc, legacy)
        try:
            with torch.device("meta"):
                probe = make()
            parameters += sum(p.numel() for p in probe[0].parameters())
            if parameters > MAX_PARAMETERS:
                raise ValueError(f"the model would have more than {MAX_PARAMETERS:,} parameters by this layer "
                                 f"({parameters:,}); check its channels, scale and repeats")
            module, c_out, stride = make() if build else probe
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        except (TypeError, RuntimeError) as exc:
            raise ValueError(f"{where}: bad arguments {brief(args)} for {name} ({str(exc).splitlines()[0]})") \
                from None
        modules.append(module)
        inputs.append(resolved)
        saved.update(j for j in ([resolved] if isinstance(resolved, int) else resolved) if j != i - 1)
        channels.append(c_out)
        strides.append(stride)
    if not isinstance(modules[-1], tuple(HEAD_BLOCKS.values())):
        raise ValueError(f"{spec.where(len(entries) - 1)}: the last layer must be Detect, Segment, OBB, Pose or "
                         "Classify")
    return BuiltLayers(modules, inputs, saved, strides)


def check_spec(spec: AnchorFreeSpec, nc: int | None = None, in_channels: int | None = None) -> None:
    """Every check :func:`build_layers` makes, without allocating the layers."""
    build_layers(spec, spec.nc if nc is None else nc, spec.in_channels if in_channels is None else in_channels,
                 build=False)


def _scaled_channels(value: Any, spec: AnchorFreeSpec, what: str = "output channels") -> int:
    """The reference's ``make_divisible(min(c, max_channels) * width, 8)``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {brief(value)}")
    bounded = value if spec.max_channels is None else min(value, spec.max_channels)
    channels = math.ceil(bounded * spec.width_multiple / 8) * 8
    if channels > MAX_CHANNELS:
        raise ValueError(f"{value} {what} x width {spec.width_multiple:g} gives {channels}, more than {MAX_CHANNELS}")
    return channels


def _check_flag(name: str, what: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}'s {what} must be true or false, got {brief(value)}")


def _make_block(name: str, args: list[Any], c_in: int, s_in: float, repeats: int, resolved: int | list[int],
                channels: list[int], strides: list[float], spec: AnchorFreeSpec, nc: int,
                legacy: bool) -> tuple[nn.Module, int, float]:
    """(module, output channels, output stride) of one entry, built as the reference builds it."""
    if name in _CHANNEL_BLOCKS:
        if not args:
            raise ValueError(f"{name} needs its output channels as the first argument")
        if len(args) - 1 > _CHANNEL_BLOCKS[name]:
            raise ValueError(f"{name} takes at most {_CHANNEL_BLOCKS[name] + 1} arguments here, got {brief(args)}")
        c_out = _scaled_channels(args[0], spec)
        extra = list(args[1:])
        if name in _DEPTH_BLOCKS:
            return _depth_block(name, extra, c_in, c_out, repeats, spec), c_out, s_in
        factor = 1
        if name == "Conv":
            check_conv_args(extra)
            factor = extra[1] if len(extra) > 1 else 1
            block: type[nn.Module] = Conv
        elif name == "SPPF":
            if extra and not is_int_in(extra[0], 1, MAX_KERNEL):
                raise ValueError(f"kernel size must be an integer from 1 to {MAX_KERNEL}, got {brief(extra[0])}")
            block = SPPF
        else:
            if extra:
                _check_flag(name, "shortcut", extra[0])
            block = Bottleneck
        if repeats == 1:
            return block(c_in, c_out, *extra), c_out, s_in * factor
        if c_in != c_out:
            raise ValueError(f"{repeats} repeats of {name} need equal input and output channels, got {c_in} -> {c_out}")
        return nn.Sequential(*(block(c_in, c_out, *extra) for _ in range(repeats))), c_out, s_in * factor ** repeats
    if repeats != 1:
        raise ValueError(f"{name} cannot be repeated (number {repeats})")
    if name == "nn.Upsample":
        size, scale, mode = (list(args) + [None, None, "nearest"][len(args):])[:3] if len(args) <= 3 else (0, 0, 0)
        if len(args) > 3 or size is not None or not is_int_in(scale, 1, MAX_UPSAMPLE):
            raise ValueError(f"nn.Upsample takes [None, integer scale factor 1..{MAX_UPSAMPLE}, mode], "
                             f"got {brief(args)}")
        if mode != "nearest":
            raise ValueError(f"nn.Upsample mode {mode!r} is not supported (only 'nearest')")
        return nn.Upsample(scale_factor=scale, mode="nearest"), c_in, s_in / scale
    if name == "Concat":
        if args not in ([], [1]):
            raise ValueError(f"Concat joins channels only (args [1]), got {brief(args)}")
        found = [strides[j] for j in resolved]
        if len(set(found)) > 1:
            listed = ", ".join(f"layer {j} at stride {s:g}" for j, s in zip(resolved, found))
            raise ValueError(f"Concat of maps of different sizes ({listed})")
        return Concat(), sum(channels[j] for j in resolved), strides[resolved[0]]
    return _head(name, args, c_in, resolved, channels, strides, spec, nc, legacy)


def _depth_block(name: str, extra: list[Any], c_in: int, c_out: int, repeats: int,
                 spec: AnchorFreeSpec) -> nn.Module:
    """A block that takes the repeat count itself: C3, C2, C2f ``[shortcut]``, C3k2 ``[c3k, expansion]``,
    C2PSA ``[expansion]``."""
    if name == "C3k2":
        c3k, expansion = (extra + [False, 0.5][len(extra):])[:2]
        _check_flag(name, "c3k", c3k)
        if not _is_number_in(expansion, 1.0):
            raise ValueError(f"C3k2's expansion must be a number in (0, 1], got {brief(expansion)}")
        # The reference turns C3k blocks on for its larger scales, whatever the YAML says.
        return C3k2(c_in, c_out, repeats, c3k or spec.scale in C3K_SCALES, expansion)
    if name == "C2PSA":
        if c_in != c_out:
            raise ValueError(f"C2PSA keeps its channels: its input has {c_in}, its output {c_out}")
        expansion = extra[0] if extra else 0.5
        if not _is_number_in(expansion, 1.0):
            raise ValueError(f"C2PSA's expansion must be a number in (0, 1], got {brief(expansion)}")
        return C2PSA(c_in, c_out, repeats, expansion)
    if extra:
        _check_flag(name, "shortcut", extra[0])
    block = {"C3": C3, "C2": C2, "C2f": C2f}[name]
    return block(c_in, c_out, repeats, *extra)


def _head(name: str, args: list[Any], c_in: int, resolved: int | list[int], channels: list[int],
          strides: list[float], spec: AnchorFreeSpec, nc: int, legacy: bool) -> tuple[nn.Module, int, float]:
    """Detect ``[nc]``, Segment ``[nc, masks, protos]`` (masks and protos optional), OBB ``[nc, angles]`` (angles
    optional, 1 only), Pose ``[nc, kpt_shape]`` (kpt_shape optional: the YAML's) or Classify ``[nc]``."""
    usage = {"Segment": "[nc, masks, protos]", "OBB": "[nc, angles]", "Pose": "[nc, kpt_shape]"}.get(name, "[nc]")
    most_args = {"Segment": 3, "OBB": 2, "Pose": 2}.get(name, 1)
    if not 1 <= len(args) <= most_args:
        raise ValueError(f"{name} takes {usage}, got {brief(args)}")
    if args[0] not in ("nc", spec.nc):
        raise ValueError(f"{name}'s class count {brief(args[0])} differs from the YAML's nc={spec.nc} (write 'nc')")
    if name == "Classify":
        return Classify(c_in, nc), nc, 0.0
    level_strides = [strides[j] for j in resolved]
    if any(s < 1 or s != int(s) for s in level_strides):
        raise ValueError(f"detection levels at strides {level_strides}, which must be whole numbers")
    level_channels = [channels[j] for j in resolved]
    level_strides_int = [int(s) for s in level_strides]
    return HEAD_BUILDERS[name](args, nc, level_channels, level_strides_int, spec, legacy), 0, 0.0


def _detect_head(args: list[Any], nc: int, channels: list[int], strides: list[int], spec: AnchorFreeSpec,
                 legacy: bool) -> nn.Module:
    return AnchorFreeDetect(nc, channels, strides, spec.reg_max, legacy)


def _segment_head(args: list[Any], nc: int, channels: list[int], strides: list[int], spec: AnchorFreeSpec,
                  legacy: bool) -> nn.Module:
    masks, protos = (list(args[1:]) + [NUM_MASKS, NUM_PROTOS][len(args) - 1:])[:2]
    if not is_int_in(masks, 1, MAX_MASKS):
        raise ValueError(f"Segment's mask count must be an integer from 1 to {MAX_MASKS}, got {brief(masks)}")
    protos = _scaled_channels(protos, spec, "prototype channels")
    return AnchorFreeSegment(nc, channels, strides, masks, protos, spec.reg_max, legacy)


def _obb_head(args: list[Any], nc: int, channels: list[int], strides: list[int], spec: AnchorFreeSpec,
              legacy: bool) -> nn.Module:
    # The loss and the decoded output know one rotation per box, the reference's ne=1.
    if len(args) > 1 and args[1] != NUM_ANGLES:
        raise ValueError(f"OBB predicts {NUM_ANGLES} angle per box, got {brief(args[1])}")
    return AnchorFreeOBB(nc, channels, strides, NUM_ANGLES, spec.reg_max, legacy)


def _pose_head(args: list[Any], nc: int, channels: list[int], strides: list[int], spec: AnchorFreeSpec,
               legacy: bool) -> nn.Module:
    if spec.kpt_shape is None:
        raise ValueError("a Pose head needs the YAML's kpt_shape: [keypoints, values each]")
    if len(args) > 1 and args[1] not in ("kpt_shape", list(spec.kpt_shape)):
        raise ValueError(f"Pose's keypoint shape {brief(args[1])} differs from the YAML's kpt_shape="
                         f"{list(spec.kpt_shape)} (write 'kpt_shape')")
    return AnchorFreePose(nc, channels, strides, spec.kpt_shape, spec.reg_max, legacy)


# Each box head block's builder, from its YAML arguments, class count, levels' channels and strides.
HEAD_BUILDERS = {"Detect": _detect_head, "Segment": _segment_head, "OBB": _obb_head, "Pose": _pose_head}


