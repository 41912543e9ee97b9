"""Interpret what :func:`read_torch_file` returns: official YOLOv5 checkpoints and plain state dicts.

An official checkpoint is a dict whose ``model`` (or ``ema``) entry is a pickled
``models.yolo.Model``/``DetectionModel`` (or ``SegmentationModel``: ``yolov5s-seg.pt`` ...); here it
arrives as a tree of :class:`PickledObject` placeholders whose state is the modules' ``__dict__``. The
weights are read off that tree the way ``nn.Module.state_dict`` would (``_modules`` / ``_parameters`` /
``_buffers``), and the architecture off its attributes (the ``yaml`` model description, Detect head
``nc``/``anchors``/``stride``, ``names``).
P5 (three levels) and P6 (four levels, ``yolov5n6.pt`` ...) models load alike; a model whose
``yaml`` describes another layout of the blocks :mod:`yolotrain.model.spec` knows is rebuilt from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...checkpoint import CheckpointError
from ...model import ModelSpec
from ...model.spec import SEGMENT_SUFFIX, SIZES, matching_version
from ...names import class_names
from .unpickler import PickledObject

# Output channels of layer 0 (``width(64)``) for each published size: identifies a bare state dict.
STEM_WIDTHS: dict[int, str] = {16: "n", 32: "s", 48: "m", 64: "l", 80: "x"}
STEM_WEIGHT = "model.0.conv.weight"
# The last convolution of a Segment head's Proto, under the head's layer: its outputs are the mask count.
PROTO_WEIGHT = "proto.cv3.conv.weight"
# Index of the Detect head in the published layouts, by number of detection levels (P5, P6).
HEAD_INDEX: dict[int, int] = {3: 24, 4: 33}
# (head class, detection levels) → the suffix of the published version with that head: yolov5s, yolov5s6,
# yolov5s-seg (segmentation models are published with three levels only).
PUBLISHED_SUFFIXES: dict[tuple[str, int], str] = {("Detect", 3): "", ("Detect", 4): "6", ("Segment", 3): SEGMENT_SUFFIX}
SILU = "torch.nn.modules.activation.SiLU"


class UnsupportedCheckpointError(CheckpointError):
    """A readable checkpoint of a model family or variant this library does not implement."""


@dataclass
class DetectorWeights:
    """What is needed to rebuild a :class:`~yolotrain.Yolov5`: architecture, class names and tensors."""

    version: str
    nc: int
    anchors: torch.Tensor  # [levels, na, 2] in pixels
    names: list[str]
    state_dict: dict[str, torch.Tensor]
    kind: str  # short description of where the weights came from, for messages
    spec: ModelSpec | None = None  # the architecture when it is not a published one
    in_channels: int = 3

    @property
    def architecture(self) -> str | ModelSpec:
        """What :class:`~yolotrain.Yolov5` takes as its ``version``."""
        return self.spec if self.spec is not None else self.version


def module_state_dict(module: PickledObject, prefix: str = "") -> dict[str, torch.Tensor]:
    """``nn.Module.state_dict()`` of a pickled module tree (persistent buffers only)."""
    state: dict[str, torch.Tensor] = {}
    skipped = module.get("_non_persistent_buffers_set") or set()
    for attribute in ("_parameters", "_buffers"):
        for name, value in (module.get(attribute) or {}).items():
            if isinstance(value, torch.Tensor) and not (attribute == "_buffers" and name in skipped):
                state.update({prefix + name: value})
    for name, child in (module.get("_modules") or {}).items():
        if isinstance(child, PickledObject):
            state.update(module_state_dict(child, f"{prefix}{name}."))
    return state


def _checkpoint_names(names: Any, nc: int) -> list[str]:
    """The checkpoint's class names; numbered names when they are absent or do not fit its ``nc``."""
    try:
        return class_names(names, nc)
    except ValueError:
        return class_names(None, nc)


def _describe_model(model: PickledObject) -> str | None:
    """Why this pickled model is not a YOLOv5 v6.0+ detection or segmentation model built from known blocks
    (None when it is)."""
    name = model.pickled_name
    qualname = name.rpartition(".")[2]
    if name.startswith("ultralytics."):
        return f"an Ultralytics YOLOv8-or-later model ({name}), which is a different architecture"
    if qualname == "ClassificationModel":
        return f"a YOLOv5 classification model ({name})"
    if qualname not in ("Model", "DetectionModel", "SegmentationModel"):
        return f"an unknown model class {name}"
    layers = (_child(model, "model").get("_modules") or {}) if _child(model, "model") else {}
    if not layers:
        return f"a {name} without layers"
    first, head = layers.get("0"), list(layers.values())[-1]
    head_name = getattr(head, "pickled_name", type(head).__name__)
    if head_name.endswith(".Classify"):
        return f"a YOLOv5 classification model ({name} with a Classify head)"
    if not head_name.endswith((".Detect", ".Segment")):
        return f"a {name} whose last layer is {head_name}, not a Detect or Segment head"
    if "anchor_grid" in (head.get("_buffers") or {}) or (
            isinstance(first, PickledObject) and first.pickled_name.endswith(".Focus")
            and not _has_layer_lists(model.get("yaml"))):
        return "a YOLOv5 model from before v6.0 (Focus stem layer); re-export it with YOLOv5 v6.0 or later"
    activations = sorted(_activation_names(model) - {SILU})
    if activations:
        return f"a model with {', '.join(activations)} activations (yolotrain's blocks use SiLU)"
    return None


def _has_layer_lists(yaml: Any) -> bool:
    return isinstance(yaml, Mapping) and "backbone" in yaml and "head" in yaml


def _activation_names(module: PickledObject) -> set[str]:
    """Class names of every ``act`` submodule in a pickled module tree."""
    found = set()
    for name, child in (module.get("_modules") or {}).items():
        if isinstance(child, PickledObject):
            found.update({child.pickled_name} if name == "act" else _activation_names(child))
    return found


def _child(module: PickledObject, name: str) -> PickledObject | None:
    child = (module.get("_modules") or {}).get(name)
    return child if isinstance(child, PickledObject) else None


def _architecture_from_yaml(yaml: Any, levels: int, layers: int, source: str,
                            head: str = "Detect") -> tuple[str, ModelSpec | None]:
    """(version, spec): a published version, or ``'custom'`` and the spec the pickled ``yaml`` describes
    (``head``: the head's class, Detect or Segment; a Segment only the layer lists or the published P5
    layout give)."""
    if not isinstance(yaml, Mapping):
        raise UnsupportedCheckpointError(f"{source}: the pickled model has no 'yaml' architecture description")
    if _has_layer_lists(yaml):
        try:
            spec = ModelSpec.from_mapping(yaml, f"{source} (model yaml)")
        except ValueError as exc:
            raise UnsupportedCheckpointError(f"{source}: unsupported checkpoint: {exc}") from None
        version = matching_version(spec)
        return (version, None) if version else ("custom", spec)
    # Only the multiples recorded: one of the published layouts, told apart by the head.
    multiples = (float(yaml.get("depth_multiple", 0)), float(yaml.get("width_multiple", 0)))
    suffix = PUBLISHED_SUFFIXES.get((head, levels))
    if suffix is None or layers != HEAD_INDEX[levels] + 1:
        raise UnsupportedCheckpointError(
            f"{source}: unsupported checkpoint: a custom YOLOv5 layout ({layers} layers, {levels} detection levels) "
            "without its model yaml")
    for size, known in SIZES.items():
        if all(abs(a - b) < 1e-6 for a, b in zip(multiples, known)):
            return size + suffix, None
    raise UnsupportedCheckpointError(
        f"{source}: custom depth/width multiples {multiples} match none of yolov5n/s/m/l/x")


def from_pickled_model(model: PickledObject, source: str) -> DetectorWeights:
    """Architecture, names and float32 weights of a pickled official YOLOv5 detection model."""
    problem = _describe_model(model)
    if problem:
        raise UnsupportedCheckpointError(f"{source}: unsupported checkpoint: {problem}")
    layers = list(_child(model, "model").get("_modules").values())
    head = layers[-1]
    version, spec = _architecture_from_yaml(model.get("yaml"), head.get("nl"), len(layers), source,
                                            head.pickled_name.rpartition(".")[2])
    state = module_state_dict(model)
    nc = int(head.get("nc"))
    # The reference keeps ``stride`` as a plain attribute; a non-persistent buffer is accepted as well.
    stride = next((s for s in (head.get("stride"), (head.get("_buffers") or {}).get("stride"), model.get("stride"))
                   if s is not None), None)
    if stride is None:
        raise UnsupportedCheckpointError(f"{source}: the Detect head records no strides")
    stride = torch.as_tensor(stride, dtype=torch.float32)
    anchors = state.get(f"model.{len(layers) - 1}.anchors")
    if anchors is None or anchors.ndim != 3 or anchors.shape[0] != stride.numel():
        raise UnsupportedCheckpointError(f"{source}: the Detect head's anchors do not match its {stride.numel()} "
                                         "strides")
    anchors = anchors.float() * stride.view(-1, 1, 1)
    kind = f"official YOLOv5{version} checkpoint ({model.pickled_name})"
    return DetectorWeights(version, nc, anchors, _checkpoint_names(model.get("names"), nc), state, kind, spec)


def from_state_dict(state: Mapping[str, torch.Tensor], source: str) -> DetectorWeights:
    """Architecture inferred from the tensor shapes of a bare YOLOv5 ``state_dict``."""
    state = dict(state)
    if state and all(key.startswith("module.") for key in state):
        # Saved from a DistributedDataParallel wrapper.
        state = {key.removeprefix("module."): value for key, value in state.items()}
    stem = state.get(STEM_WEIGHT)
    levels = next((n for n, i in HEAD_INDEX.items() if f"model.{i}.anchors" in state), 3)
    head_index = HEAD_INDEX[levels]
    anchors = state.get(f"model.{head_index}.anchors")
    first_head = state.get(f"model.{head_index}.m.0.weight")
    if stem is None or anchors is None or first_head is None:
        raise UnsupportedCheckpointError(
            f"{source}: a state dict without the YOLOv5 v6.0+ keys {STEM_WEIGHT}, model.{head_index}.anchors and "
            f"model.{head_index}.m.0.weight")
    width = int(stem.shape[0])
    if width not in STEM_WIDTHS:
        raise UnsupportedCheckpointError(f"{source}: stem width {width} matches none of yolov5n/s/m/l/x")
    if anchors.ndim != 3 or anchors.shape[0] != levels:
        raise UnsupportedCheckpointError(f"{source}: anchors of shape {tuple(anchors.shape)}, expected {levels} levels")
    na = int(anchors.shape[1])
    proto = state.get(f"model.{head_index}.{PROTO_WEIGHT}")  # a Segment head: mask coefficients follow the classes
    masks = int(proto.shape[0]) if proto is not None and levels == 3 else 0
    nc = int(first_head.shape[0]) // na - 5 - masks
    strides = [8.0 * 2 ** level for level in range(levels)]
    pixels = anchors.float() * torch.tensor(strides, dtype=torch.float32).view(-1, 1, 1)
    version = STEM_WIDTHS[width] + ("6" if levels == 4 else SEGMENT_SUFFIX if masks else "")
    return DetectorWeights(version, nc, pixels, _checkpoint_names(None, nc), state, f"YOLOv5{version} state dict")


def interpret(obj: Any, source: str, use_ema: bool = True) -> DetectorWeights:
    """Find the detector in an unpickled checkpoint: official dict, bare model, or state dict."""
    if isinstance(obj, Mapping) and not _is_state_dict(obj):
        # The reference prefers the EMA weights when a checkpoint has them (models/experimental.py).
        keys = ("ema", "model") if use_ema else ("model", "ema")
        candidates = [obj.get(key) for key in keys] + [obj.get("state_dict")]
        found = next((c for c in candidates if c is not None), None)
        if found is None:
            raise UnsupportedCheckpointError(
                f"{source}: a dict with keys {sorted(map(str, obj))[:8]} but no 'model', 'ema' or 'state_dict' entry")
        obj = found
    if isinstance(obj, PickledObject):
        return from_pickled_model(obj, source)
    if isinstance(obj, Mapping) and _is_state_dict(obj):
        return from_state_dict(obj, source)
    raise UnsupportedCheckpointError(f"{source}: holds a {type(obj).__name__}, not a YOLOv5 model or state dict")


def _is_state_dict(obj: Mapping[str, Any]) -> bool:
    return bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())
