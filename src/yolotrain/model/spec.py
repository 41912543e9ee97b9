"""Model architectures in the reference's model-YAML format, and their translation into layers.

A spec is what a reference ``yolov5s.yaml`` holds: ``nc``, ``depth_multiple``, ``width_multiple``,
``anchors`` and the ``backbone``/``head`` lists of ``[from, number, module, args]`` entries. The
published P5 (``n``…``x``) and P6 (``n6``…``x6``) architectures are such specs; a user's YAML is
read into one with each entry's line number, so a bad entry is reported as ``file:line: ...``.
:func:`build_layers` turns a spec into modules exactly as the reference's ``parse_model`` does
(same layer order, channel rounding and depth scaling, hence the same parameters and names).
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import yaml
from torch import nn

from ..messages import brief
from ..yamlio import read_yaml_document
from .blocks import C3, SPP, SPPF, Bottleneck, Concat, Conv, Focus
from .detect import DEFAULT_ANCHORS, Detect
from .segment import NUM_MASKS, NUM_PROTOS, Proto, Segment

# Entries are [from, number, module, args]; "nc" and "anchors" in args stand for the spec's values.
Entry = list[Any]

P5_ANCHORS = DEFAULT_ANCHORS  # P3/8, P4/16, P5/32
P6_ANCHORS: tuple[tuple[int, ...], ...] = (
    (19, 27, 44, 40, 38, 94),  # P3/8
    (96, 68, 86, 152, 180, 137),  # P4/16
    (140, 301, 303, 264, 238, 542),  # P5/32
    (436, 615, 739, 380, 925, 792),  # P6/64
)

# The reference's models/yolov5s.yaml (YOLOv5 v6.0 layout).
P5_BACKBONE: tuple[Entry, ...] = (
    [-1, 1, "Conv", [64, 6, 2, 2]],  # 0 P1/2
    [-1, 1, "Conv", [128, 3, 2]],  # 1 P2/4
    [-1, 3, "C3", [128]],
    [-1, 1, "Conv", [256, 3, 2]],  # 3 P3/8
    [-1, 6, "C3", [256]],
    [-1, 1, "Conv", [512, 3, 2]],  # 5 P4/16
    [-1, 9, "C3", [512]],
    [-1, 1, "Conv", [1024, 3, 2]],  # 7 P5/32
    [-1, 3, "C3", [1024]],
    [-1, 1, "SPPF", [1024, 5]],  # 9
)
P5_HEAD: tuple[Entry, ...] = (
    [-1, 1, "Conv", [512, 1, 1]],
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 6], 1, "Concat", [1]],  # cat backbone P4
    [-1, 3, "C3", [512, False]],  # 13
    [-1, 1, "Conv", [256, 1, 1]],
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 4], 1, "Concat", [1]],  # cat backbone P3
    [-1, 3, "C3", [256, False]],  # 17 (P3/8 small)
    [-1, 1, "Conv", [256, 3, 2]],
    [[-1, 14], 1, "Concat", [1]],  # cat head P4
    [-1, 3, "C3", [512, False]],  # 20 (P4/16 medium)
    [-1, 1, "Conv", [512, 3, 2]],
    [[-1, 10], 1, "Concat", [1]],  # cat head P5
    [-1, 3, "C3", [1024, False]],  # 23 (P5/32 large)
    [[17, 20, 23], 1, "Detect", ["nc", "anchors"]],
)

# The reference's models/hub/yolov5s6.yaml: one more backbone stage (P6/64), SPPF after it.
P6_BACKBONE: tuple[Entry, ...] = (
    [-1, 1, "Conv", [64, 6, 2, 2]],  # 0 P1/2
    [-1, 1, "Conv", [128, 3, 2]],  # 1 P2/4
    [-1, 3, "C3", [128]],
    [-1, 1, "Conv", [256, 3, 2]],  # 3 P3/8
    [-1, 6, "C3", [256]],
    [-1, 1, "Conv", [512, 3, 2]],  # 5 P4/16
    [-1, 9, "C3", [512]],
    [-1, 1, "Conv", [768, 3, 2]],  # 7 P5/32
    [-1, 3, "C3", [768]],
    [-1, 1, "Conv", [1024, 3, 2]],  # 9 P6/64
    [-1, 3, "C3", [1024]],
    [-1, 1, "SPPF", [1024, 5]],  # 11
)
P6_HEAD: tuple[Entry, ...] = (
    [-1, 1, "Conv", [768, 1, 1]],
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 8], 1, "Concat", [1]],  # cat backbone P5
    [-1, 3, "C3", [768, False]],  # 15
    [-1, 1, "Conv", [512, 1, 1]],
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 6], 1, "Concat", [1]],  # cat backbone P4
    [-1, 3, "C3", [512, False]],  # 19
    [-1, 1, "Conv", [256, 1, 1]],
    [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 4], 1, "Concat", [1]],  # cat backbone P3
    [-1, 3, "C3", [256, False]],  # 23 (P3/8 small)
    [-1, 1, "Conv", [256, 3, 2]],
    [[-1, 20], 1, "Concat", [1]],  # cat head P4
    [-1, 3, "C3", [512, False]],  # 26 (P4/16 medium)
    [-1, 1, "Conv", [512, 3, 2]],
    [[-1, 16], 1, "Concat", [1]],  # cat head P5
    [-1, 3, "C3", [768, False]],  # 29 (P5/32 large)
    [-1, 1, "Conv", [768, 3, 2]],
    [[-1, 12], 1, "Concat", [1]],  # cat head P6
    [-1, 3, "C3", [1024, False]],  # 32 (P6/64 xlarge)
    [[23, 26, 29, 32], 1, "Detect", ["nc", "anchors"]],
)

# The reference's models/segment/yolov5s-seg.yaml: the P5 layout with a Segment head (32 masks, 256 protos).
SEGMENT_HEAD: Entry = [[17, 20, 23], 1, "Segment", ["nc", "anchors", NUM_MASKS, NUM_PROTOS]]
SEGMENT_SUFFIX = "-seg"
# The head entries of the published variants by version suffix (a version without one keeps its layout's
# Detect head): a new head variant is one more row.
SUFFIX_HEADS: dict[str, Entry] = {SEGMENT_SUFFIX: SEGMENT_HEAD}

# (depth multiple, width multiple) of each published size; a trailing 6 selects the P6 layout.
SIZES: dict[str, tuple[float, float]] = {
    "n": (0.33, 0.25),
    "s": (0.33, 0.50),
    "m": (0.67, 0.75),
    "l": (1.00, 1.00),
    "x": (1.33, 1.25),
}
BLOCKS = ("Conv", "C3", "SPPF", "SPP", "Focus", "Bottleneck", "Concat", "nn.Upsample", "Detect", "Segment")
# The heads, the last layer of every architecture, by block name; each declares the task its outputs serve.
HEAD_BLOCKS: dict[str, type[Detect]] = {"Detect": Detect, "Segment": Segment}
HEADS = tuple(HEAD_BLOCKS)
# Blocks whose first argument is an output channel count scaled by the width multiple.
_CHANNEL_BLOCKS = {"Conv": Conv, "C3": C3, "SPPF": SPPF, "SPP": SPP, "Focus": Focus, "Bottleneck": Bottleneck}
# How many arguments after the channel count each block takes here (the reference's g, e, act ... are not).
_MAX_EXTRA_ARGS = {"Conv": 4, "Focus": 4, "C3": 1, "Bottleneck": 1, "SPPF": 1, "SPP": 1}

# Bounds on any spec (a model YAML, a checkpoint's cfg, a pickled model's yaml), checked before its
# layers are built, so a hostile or mistyped file is one line rather than minutes or gigabytes. The
# published architectures stay far inside them (multiples <= 1.33, 12 repeats, 1280 channels,
# kernels <= 13, 140 M parameters for yolov5x6); 300 M parameters are 1.2 GB in float32.
MAX_MULTIPLE = 16.0
MAX_LAYERS = 1000
MAX_REPEATS = 100
MAX_CHANNELS = 16384
MAX_KERNEL = 31
MAX_CONV_STRIDE = 16
MAX_UPSAMPLE = 16
MAX_CLASSES = 10_000
MAX_MASKS = 256
MAX_IN_CHANNELS = 64
MAX_ANCHOR_LEVELS = 8
MAX_ANCHORS_PER_LEVEL = 16
MAX_PARAMETERS = 300_000_000


@dataclass
class ModelSpec:
    """One architecture in the reference's model-YAML terms (``source`` and ``lines`` only name errors)."""

    depth_multiple: float
    width_multiple: float
    backbone: list[Entry]
    head: list[Entry]
    anchors: list[list[float]]
    nc: int = 80
    in_channels: int = 3
    source: str = "model spec"
    lines: list[int] | None = field(default=None, compare=False, repr=False)

    @property
    def layers(self) -> list[Entry]:
        return [*self.backbone, *self.head]

    def where(self, index: int | None = None) -> str:
        """``file:line`` of a layer entry (or of the file), for error messages."""
        if index is not None and self.lines is not None and index < len(self.lines):
            return f"{self.source}:{self.lines[index]}"
        return self.source if index is None else f"{self.source}: layer {index}"

    def layout(self) -> str:
        """The architecture as a canonical string: multiples and layer entries (not nc or anchors)."""
        return json.dumps([self.depth_multiple, self.width_multiple, self.layers])

    def to_dict(self) -> dict[str, Any]:
        """The spec as a reference model-YAML mapping (JSON-serialisable)."""
        return {"nc": self.nc, "depth_multiple": self.depth_multiple, "width_multiple": self.width_multiple,
                "anchors": self.anchors, "ch": self.in_channels, "backbone": self.backbone, "head": self.head}

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any], source: str = "model spec",
                     lines: Mapping[str, Any] | None = None) -> ModelSpec:
        """A spec from a model-YAML mapping; ``lines`` (from :func:`read_model_yaml`) locates errors."""
        lines = lines or {}
        where = (lambda key: f"{source}:{lines[key]}" if key in lines else source)  # noqa: E731
        if not isinstance(cfg, Mapping):
            raise ValueError(f"{source}: a model YAML must be a mapping with backbone and head lists")
        for key in ("depth_multiple", "width_multiple", "backbone", "head"):
            if key not in cfg:
                raise ValueError(f"{source}: no '{key}' entry")
        if "activation" in cfg:
            raise ValueError(f"{where('activation')}: 'activation' is not supported (every Conv uses SiLU)")
        multiples = []
        for key in ("depth_multiple", "width_multiple"):
            value = cfg[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{where(key)}: {key} must be a positive number, got {brief(value)}")
            if value > MAX_MULTIPLE:
                raise ValueError(f"{where(key)}: {key} {value:g} is more than {MAX_MULTIPLE:g}")
            multiples.append(float(value))
        nc = cfg.get("nc", 80)
        if not is_int_in(nc, 1, MAX_CLASSES):
            raise ValueError(f"{where('nc')}: nc must be an integer from 1 to {MAX_CLASSES}, got {brief(nc)}")
        in_channels = cfg.get("ch", 3)
        if not is_int_in(in_channels, 1, MAX_IN_CHANNELS):
            raise ValueError(f"{where('ch')}: ch must be an integer from 1 to {MAX_IN_CHANNELS}, "
                             f"got {brief(in_channels)}")
        anchors = cfg.get("anchors")
        if isinstance(anchors, int) and not isinstance(anchors, bool):
            raise ValueError(f"{where('anchors')}: anchors: {anchors} gives a count without sizes, which needs "
                             "autoanchor (not supported); give rows of (w, h) pixel pairs, one per detection level")
        if not _is_anchor_table(anchors):
            raise ValueError(f"{where('anchors')}: anchors must be a list of rows of (w, h) pixel pairs, one row per "
                             f"detection level (at most {MAX_ANCHOR_LEVELS} rows of {MAX_ANCHORS_PER_LEVEL} pairs), "
                             f"got {brief(anchors)}")
        parts = []
        for key in ("backbone", "head"):
            entries = cfg[key]
            if not isinstance(entries, list) or not 0 < len(entries) <= MAX_LAYERS:
                raise ValueError(f"{where(key)}: {key} must be a list of 1 to {MAX_LAYERS} [from, number, module, "
                                 "args] entries")
            parts.append([normalise_entry(e) for e in entries])
        entry_lines = [*lines.get("backbone_entries", []), *lines.get("head_entries", [])] or None
        return cls(multiples[0], multiples[1], parts[0], parts[1], [[float(v) for v in row] for row in anchors],
                   nc, in_channels, source, entry_lines)


def builtin_spec(version: str) -> ModelSpec:
    """The published architecture ``n``…``x`` (P5), ``n6``…``x6`` (P6) or ``n-seg``…``x-seg`` (P5 with
    the Segment head)."""
    suffix = head_suffix(version)
    size = version.removesuffix(suffix)
    size, p6 = size.removesuffix("6"), size.endswith("6")
    depth, width = SIZES[size]
    backbone, head, anchors = (P6_BACKBONE, P6_HEAD, P6_ANCHORS) if p6 else (P5_BACKBONE, P5_HEAD, P5_ANCHORS)
    head = [*head[:-1], SUFFIX_HEADS[suffix]] if suffix else head
    return ModelSpec(depth, width, [list(e) for e in backbone], [list(e) for e in head],
                     [[float(v) for v in row] for row in anchors], source=f"yolov5{version}")


def head_suffix(version: str) -> str:
    """The head variant's suffix of a published version (``n-seg``: ``-seg``), ``""`` for the layout's Detect."""
    return next((suffix for suffix in SUFFIX_HEADS if version.endswith(suffix)), "")


def published_head(version: str) -> type[Detect]:
    """The head class of a published version (what tells its task)."""
    entry = SUFFIX_HEADS.get(head_suffix(version))
    return HEAD_BLOCKS[entry[2]] if entry is not None else Detect


def published_variant(version: str, task: str) -> str:
    """The published version of ``version``'s size and layout whose head serves ``task`` (``n`` for
    segmentation: ``n-seg``): ``version`` itself when its head has a suffix already or the task's head is the
    layout's own Detect (a head that does not serve ``task`` is reported once the model is built).

    Raises:
        ValueError: that layout has no published model with the task's head (P6 and segmentation).
    """
    suffix = next((suffix for suffix, entry in SUFFIX_HEADS.items() if HEAD_BLOCKS[entry[2]].task == task), "")
    if not suffix or head_suffix(version):
        return version
    if version + suffix not in VERSIONS:
        layout = "P6" if version.endswith("6") else "P5"
        raise ValueError(f"no published {HEAD_BLOCKS[SUFFIX_HEADS[suffix][2]].model_kind} model of the {layout} "
                         f"layout yolov5{version}")
    return version + suffix


VERSIONS: tuple[str, ...] = (*SIZES, *(f"{size}6" for size in SIZES),
                             *(size + suffix for suffix in SUFFIX_HEADS for size in SIZES))
_BUILTIN_LAYOUTS: dict[str, str] = {version: builtin_spec(version).layout() for version in VERSIONS}


def matching_version(spec: ModelSpec) -> str | None:
    """The published version whose multiples and layers ``spec`` repeats (None for a custom layout)."""
    layout = spec.layout()
    return next((version for version, known in _BUILTIN_LAYOUTS.items() if known == layout), None)


def read_model_yaml(path: str | os.PathLike) -> ModelSpec:
    """Read a reference-format model YAML, remembering each layer entry's line for error messages."""
    source = os.fspath(path)
    cfg, lines = read_yaml_with_lines(source)
    return ModelSpec.from_mapping(cfg, source, lines)


def read_yaml_with_lines(source: str) -> tuple[Any, dict[str, Any]]:
    """A model YAML's mapping and the line of each top-level key and of each ``backbone``/``head`` entry (under
    ``backbone_entries``/``head_entries``), which errors name."""
    if not os.path.isfile(source):
        raise FileNotFoundError(f"model YAML not found: {source}")
    cfg, node = read_yaml_document(source)
    lines: dict[str, Any] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            lines[str(key_node.value)] = key_node.start_mark.line + 1
            if key_node.value in ("backbone", "head") and isinstance(value_node, yaml.SequenceNode):
                lines[f"{key_node.value}_entries"] = [item.start_mark.line + 1 for item in value_node.value]
    return cfg, lines


def is_int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_anchor_table(anchors: Any) -> bool:
    return (isinstance(anchors, (list, tuple)) and 0 < len(anchors) <= MAX_ANCHOR_LEVELS
            and all(isinstance(row, (list, tuple)) and 0 < len(row) <= 2 * MAX_ANCHORS_PER_LEVEL
                    and len(row) % 2 == 0
                    and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in row)
                    for row in anchors)
            and len({len(row) for row in anchors}) == 1)


def normalise_entry(entry: Any) -> Any:
    """``[from, number, module, args]`` with YAML's string ``'None'`` as None (checked when built)."""
    if not isinstance(entry, (list, tuple)) or len(entry) != 4:
        return entry
    source, number, module, args = entry
    if isinstance(args, (list, tuple)):
        args = [None if a == "None" else a for a in args]
    return [list(source) if isinstance(source, tuple) else source, number, module, args]


@dataclass
class BuiltLayers:
    """Modules in layer order, where each takes its input from, and which outputs later layers reuse."""

    modules: list[nn.Module]
    inputs: list[int | list[int]]  # absolute layer indices; an int means a single tensor input
    saved: set[int]
    strides: list[float]  # output stride of each layer relative to the input image


def build_layers(spec: ModelSpec, nc: int, anchors: torch.Tensor, in_channels: int,
                 build: bool = True, stop: int | None = None) -> BuiltLayers:
    """The reference's ``parse_model`` on ``spec``: one module per entry, the Detect (or Segment) head last.

    ``anchors`` (pixels, ``[levels, na, 2]``) replaces the spec's own; the stride of every layer is
    tracked so that Concat inputs of different resolutions and Detect strides are known up front.
    Every entry is checked against the bounds above first; with ``build=False`` the layers before
    Detect stay on the "meta" device (a check that allocates nothing: :func:`check_spec`). With ``stop``,
    only the first ``stop`` entries are built (a classifier's backbone: no head).
    """
    entries = spec.layers
    na = anchors.shape[1]
    outputs_no = na * (nc + 5 + _head_masks(entries[-1] if entries else None))
    channels: list[int] = []
    strides: list[float] = []
    modules: list[nn.Module] = []
    inputs: list[int | list[int]] = []
    saved: set[int] = set()
    parameters = 0
    for i, entry in enumerate(entries[:stop]):
        where = spec.where(i)
        if not isinstance(entry, list) or len(entry) != 4:
            raise ValueError(f"{where}: a layer must be [from, number, module, args], got {entry!r}")
        source, number, name, args = entry
        if name not in BLOCKS:
            raise ValueError(f"{where}: unknown block {name!r} (supported: {', '.join(BLOCKS)})")
        if not isinstance(args, list):
            raise ValueError(f"{where}: args of {name} must be a list, got {args!r}")
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ValueError(f"{where}: number must be a positive integer, got {brief(number)}")
        resolved = resolve_inputs(source, i, where)
        if (name in ("Concat", *HEADS)) != isinstance(resolved, list):
            expected = "a list of layers" if name in ("Concat", *HEADS) else "one layer"
            raise ValueError(f"{where}: {name} takes its input from {expected}, got from={source!r}")
        if name in HEADS and i != len(entries) - 1:
            raise ValueError(f"{where}: {name} must be the last layer")
        if i == 0:
            c_in, s_in = in_channels, 1.0
        else:
            c_in, s_in = (channels[resolved], strides[resolved]) if isinstance(resolved, int) else (0, 0.0)
        repeats = max(round(number * spec.depth_multiple), 1) if number > 1 else number
        if repeats > MAX_REPEATS:
            raise ValueError(f"{where}: number {number} x depth_multiple {spec.depth_multiple:g} gives {repeats} "
                             f"repeats of {name}, more than {MAX_REPEATS}")
        make = functools.partial(_make_block, name, args, c_in, s_in, repeats, resolved, channels, strides,
                                 spec, nc, anchors, outputs_no)
        try:
            # Built first without memory (parameters on the "meta" device) to count its parameters,
            # then for real only while the model stays within MAX_PARAMETERS. Detect, whose bias
            # priors need real tensors, is counted from its convolutions: one 1x1 with bias per level
            # (and Segment's Proto, built without memory).
            probe = None
            if name in HEADS:
                parameters += sum((channels[j] + 1) * outputs_no for j in resolved)
                if name == "Segment":
                    with torch.device("meta"):
                        proto = Proto(channels[resolved[0]], *_segment_sizes(args, spec)[::-1])
                    parameters += sum(p.numel() for p in proto.parameters())
            else:
                with torch.device("meta"):
                    probe = make()
                parameters += sum(p.numel() for p in probe[0].parameters())
            if parameters > MAX_PARAMETERS:
                raise ValueError(f"the model would have more than {MAX_PARAMETERS:,} parameters by this layer "
                                 f"({parameters:,}); check its channels, width_multiple and repeats")
            module, c_out, stride = make() if build or probe is None else probe
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
    if stop is None and not isinstance(modules[-1], tuple(HEAD_BLOCKS.values())):
        raise ValueError(f"{spec.where(len(entries) - 1)}: the last layer must be Detect or Segment")
    return BuiltLayers(modules, inputs, saved, strides)


def check_spec(spec: ModelSpec, nc: int | None = None, in_channels: int | None = None) -> None:
    """Every check :func:`build_layers` makes, without allocating the layers (for stored architectures,
    such as a checkpoint's ``cfg``, validated with the rest of their file)."""
    anchors = torch.tensor(spec.anchors, dtype=torch.float32).view(len(spec.anchors), -1, 2)
    build_layers(spec, spec.nc if nc is None else nc, anchors, spec.in_channels if in_channels is None else in_channels,
                 build=False)


def resolve_inputs(source: Any, i: int, where: str) -> int | list[int]:
    """``from`` as absolute indices of earlier layers (-1 is the previous layer; the image for layer 0)."""
    def absolute(j: Any) -> int:
        if isinstance(j, bool) or not isinstance(j, int):
            raise ValueError(f"{where}: 'from' must be a layer index or a list of them, got {source!r}")
        k = j + i if j < 0 else j
        if not (0 <= k < i or (i == 0 and j == -1)):
            raise ValueError(f"{where}: 'from' {j} does not name an earlier layer (this is layer {i})")
        return k

    if isinstance(source, list):
        if not source:
            raise ValueError(f"{where}: 'from' is an empty list")
        return [absolute(j) for j in source]
    return absolute(source)


def _channels(value: Any, spec: ModelSpec, outputs_no: int) -> int:
    """Output channels: the reference's ``make_divisible(c * width_multiple, 8)``, except a head-sized output."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"output channels must be a positive integer, got {brief(value)}")
    channels = value if value == outputs_no else math.ceil(value * spec.width_multiple / 8) * 8
    if channels > MAX_CHANNELS:
        raise ValueError(f"{value} output channels x width_multiple {spec.width_multiple:g} gives {channels}, "
                         f"more than {MAX_CHANNELS}")
    return channels


def _make_block(name: str, args: list[Any], c_in: int, s_in: float, repeats: int, resolved: int | list[int],
                channels: list[int], strides: list[float], spec: ModelSpec, nc: int, anchors: torch.Tensor,
                outputs_no: int) -> tuple[nn.Module, int, float]:
    """(module, output channels, output stride) of one entry, built as the reference builds it."""
    if name in _CHANNEL_BLOCKS:
        if not args:
            raise ValueError(f"{name} needs its output channels as the first argument")
        if len(args) - 1 > _MAX_EXTRA_ARGS[name]:
            raise ValueError(f"{name} takes at most {_MAX_EXTRA_ARGS[name] + 1} arguments here, got {args!r}")
        c_out = _channels(args[0], spec, outputs_no)
        extra = list(args[1:])
        block = _CHANNEL_BLOCKS[name]
        if name == "C3":  # the depth goes into the block, not into repeated copies
            return block(c_in, c_out, repeats, *extra), c_out, s_in
        factor = 1
        if name in ("Conv", "Focus"):
            check_conv_args(extra)
            factor = (extra[1] if len(extra) > 1 else 1) * (2 if name == "Focus" else 1)
        if name == "SPPF" and extra and not is_int_in(extra[0], 1, MAX_KERNEL):
            raise ValueError(f"kernel size must be an integer from 1 to {MAX_KERNEL}, got {brief(extra[0])}")
        if name == "SPP" and extra:
            if not (isinstance(extra[0], list) and 0 < len(extra[0]) <= 8
                    and all(is_int_in(k, 1, MAX_KERNEL) for k in extra[0])):
                raise ValueError(f"SPP kernel sizes must be a list of 1 to 8 integers from 1 to {MAX_KERNEL}, "
                                 f"got {brief(extra[0])}")
            extra = [tuple(extra[0])]
        if repeats == 1:
            return block(c_in, c_out, *extra), c_out, s_in * factor
        if c_in != c_out:
            raise ValueError(f"{repeats} repeats of {name} need equal input and output channels, "
                             f"got {c_in} -> {c_out}")
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
            raise ValueError(f"Concat joins channels only (args [1]), got {args!r}")
        _check_same_stride(name, resolved, strides)
        return Concat(), sum(channels[j] for j in resolved), strides[resolved[0]]
    # Detect: [nc, anchors], each standing for the spec's value or given literally; Segment: [nc, anchors,
    # masks, protos] (masks and protos optional).
    if not (len(args) == 2 or (name == "Segment" and 2 <= len(args) <= 4)):
        usage = "[nc, anchors, masks, protos]" if name == "Segment" else "[nc, anchors]"
        raise ValueError(f"{name} takes {usage}, got {args!r}")
    if args[0] not in ("nc", spec.nc):
        raise ValueError(f"{name}'s class count {args[0]!r} differs from the YAML's nc={spec.nc} (write 'nc')")
    if args[1] != "anchors" and not _is_anchor_table(args[1]):
        raise ValueError(f"{name}'s anchors must be 'anchors' or a list of (w, h) pixel rows (an anchor count "
                         f"needs autoanchor, which is not supported), got {args[1]!r}")
    table = anchors if args[1] == "anchors" else torch.tensor(args[1], dtype=torch.float32).view(len(args[1]), -1, 2)
    if table.shape[0] != len(resolved):
        raise ValueError(f"{table.shape[0]} anchor rows for {len(resolved)} detection levels")
    level_strides = [strides[j] for j in resolved]
    if any(s < 1 or s != int(s) for s in level_strides):
        raise ValueError(f"detection levels at strides {level_strides}, which must be whole numbers")
    level_channels = tuple(channels[j] for j in resolved)
    level_strides_int = tuple(int(s) for s in level_strides)
    if name == "Segment":
        return Segment(nc, table, level_channels, level_strides_int, *_segment_sizes(args, spec)), 0, 0.0
    return Detect(nc, table, level_channels, level_strides_int), 0, 0.0


def _head_masks(entry: Any) -> int:
    """Mask coefficients per anchor of a head entry (0 for Detect or an entry not yet checked)."""
    if not (isinstance(entry, list) and len(entry) == 4 and entry[2] == "Segment" and isinstance(entry[3], list)):
        return 0
    masks = entry[3][2] if len(entry[3]) > 2 else NUM_MASKS
    return masks if is_int_in(masks, 1, MAX_MASKS) else 0


def _segment_sizes(args: list[Any], spec: ModelSpec) -> tuple[int, int]:
    """(masks, prototype channels) of a Segment entry; the channels scaled by the width multiple as the
    reference scales them (``make_divisible(npr * width_multiple, 8)``)."""
    masks, protos = (list(args[2:]) + [NUM_MASKS, NUM_PROTOS][len(args) - 2:])[:2]
    if not is_int_in(masks, 1, MAX_MASKS):
        raise ValueError(f"Segment's mask count must be an integer from 1 to {MAX_MASKS}, got {brief(masks)}")
    if not is_int_in(protos, 1, MAX_CHANNELS):
        raise ValueError(f"Segment's prototype channels must be an integer from 1 to {MAX_CHANNELS}, "
                         f"got {brief(protos)}")
    return masks, min(math.ceil(protos * spec.width_multiple / 8) * 8, MAX_CHANNELS)


def check_conv_args(extra: list[Any]) -> None:
    """Conv/Focus ``[kernel, stride, padding, groups]`` after the channels (each optional)."""
    kernel, stride, padding, groups = (extra + [1, 1, None, 1][len(extra):])[:4]
    if not is_int_in(kernel, 1, MAX_KERNEL):
        raise ValueError(f"kernel size must be an integer from 1 to {MAX_KERNEL}, got {brief(kernel)}")
    if not is_int_in(stride, 1, MAX_CONV_STRIDE):
        raise ValueError(f"stride must be an integer from 1 to {MAX_CONV_STRIDE}, got {brief(stride)}")
    if padding is not None and not is_int_in(padding, 0, kernel):
        raise ValueError(f"padding must be None or an integer from 0 to the kernel size {kernel}, "
                         f"got {brief(padding)}")
    if not is_int_in(groups, 1, MAX_CHANNELS):
        raise ValueError(f"groups must be a positive integer, got {brief(groups)}")


def _check_same_stride(name: str, resolved: Sequence[int], strides: list[float]) -> None:
    found = [strides[j] for j in resolved]
    if len(set(found)) > 1:
        listed = ", ".join(f"layer {j} at stride {s:g}" for j, s in zip(resolved, found))
        raise ValueError(f"{name} of maps of different sizes ({listed})")
