"""Interpret what :func:`.unpickler.read_torch_file` returns for an official Ultralytics checkpoint (``yolov8n.pt``,
``yolo11n-seg.pt``, ``yolov5nu.pt``, ``yolov8n-cls.pt``, ``yolov8n-pose.pt`` ...), never running its pickled code.

Ultralytics 8.x saves a dict whose ``model`` (a released file, stripped of its training state) or ``ema`` (a
trainer's ``last.pt``/``best.pt``, whose ``model`` is None) entry is a pickled ``ultralytics.nn.tasks``
``DetectionModel``, ``SegmentationModel``, ``OBBModel``, ``ClassificationModel`` or ``PoseModel`` in half
precision, beside ``train_args``, ``date``, ``version`` .... Here the model arrives as a tree of
:class:`~.unpickler.PickledObject` placeholders whose state is the modules' ``__dict__``: the weights are read off it
the way ``nn.Module.state_dict`` would name them (:func:`.official.module_state_dict`), the architecture off the
model's ``yaml`` attribute (the model YAML as Ultralytics loaded it, with ``scale`` and ``yaml_file``), the class
names off ``names`` (``{0: 'person', ...}``), and ``nc``/``reg_max``/``stride`` (and a pose head's ``kpt_shape``)
off the head, checked against its tensors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ...checkpoint import CheckpointError
from ...names import class_names
from .official import UnsupportedCheckpointError, module_state_dict
from .unpickler import PickledObject

ULTRALYTICS_PREFIX = "ultralytics."
# The pickled model class (its qualname: the module moved between Ultralytics versions) → the task it serves,
# and the head class each task's model ends with.
MODEL_TASKS: dict[str, str] = {"DetectionModel": "detect", "SegmentationModel": "segment", "OBBModel": "obb",
                               "ClassificationModel": "classify", "PoseModel": "pose"}
TASK_HEADS: dict[str, str] = {"detect": "Detect", "segment": "Segment", "obb": "OBB", "classify": "Classify",
                              "pose": "Pose"}
SUPPORTED = ("YOLOv8, YOLO11 and YOLOv5u detection, segmentation, oriented-box (OBB), classification and pose models "
             "are supported")
# Ultralytics model classes this library does not implement, by qualname, as a message names them.
UNSUPPORTED_MODELS: dict[str, str] = {
    "RTDETRDetectionModel": "an RT-DETR model",
    "WorldModel": "a YOLO-World model",
    "YOLOEModel": "a YOLOE model",
    "YOLOESegModel": "a YOLOE segmentation model",
    "SemanticSegmentationModel": "a semantic segmentation model",
    "DepthModel": "a depth estimation model",
    "YOLOv10DetectionModel": "a YOLOv10 end-to-end model",
}
# A published YAML name: family (yolov8, yolo11, yoloe-v8 ...), the scale letter when the name carries it, the rest
# (``-seg``, ``u``, ``-p6`` ...); the pattern of Ultralytics' own ``guess_model_scale``.
_YAML_NAME = re.compile(r"(yolo(?:e-)?v?\d+)([nslmx])?(.*)")
_PLAIN_SCALARS = (str, int, float, bool, type(None))


class _NotPlain(ValueError):
    """A model YAML value that is not a plain YAML value (dict, list, string, number, bool, None)."""


@dataclass(frozen=True)
class UltralyticsWeights:
    """What an official Ultralytics checkpoint holds, read as data: enough to build the model its ``yaml`` describes
    (whose ``model`` layers have Ultralytics' indices) and load ``state_dict`` into it."""

    task: str  # "detect", "segment", "obb", "classify" or "pose"
    yaml: dict[str, Any]  # the model YAML as Ultralytics kept it: backbone, head, nc, scales, scale, yaml_file ...
    state_dict: dict[str, torch.Tensor]  # Ultralytics' ``model.state_dict()`` names, tensors as stored (half)
    names: list[str]  # class names, index = class id
    in_channels: int
    architecture: str | None  # the published-style name (``yolov8n``, ``yolo11s-seg``, ``yolov5nu``), if derivable
    kind: str  # short description of where the weights came from, for messages
    nc: int  # the head's class count, checked against its tensors
    reg_max: int | None  # DFL bins of a detection head (None for a classifier)
    stride: tuple[float, ...]  # the detection levels' strides (empty for a classifier)
    kpt_shape: tuple[int, int] | None = None  # a pose head's (keypoints, values each), checked against its tensors


def is_ultralytics_checkpoint(obj: Any) -> bool:
    """Whether an unpickled checkpoint (a dict with ``model``/``ema`` entries, or a bare model) holds a pickled
    Ultralytics model: such files are read by :func:`read_ultralytics`, not as YOLOv5 checkpoints."""
    entries = [obj.get("ema"), obj.get("model")] if isinstance(obj, Mapping) else [obj]
    return any(isinstance(entry, PickledObject) and entry.pickled_name.startswith(ULTRALYTICS_PREFIX)
               for entry in entries)


def read_ultralytics(obj: Any, source: str, use_ema: bool = True) -> UltralyticsWeights:
    """The model of an unpickled official Ultralytics checkpoint (see :func:`is_ultralytics_checkpoint`); its EMA
    weights when the file has them and ``use_ema`` (a released file has only ``model``).

    Raises:
        UnsupportedCheckpointError: a model family, task or head this library does not implement
            (RT-DETR, YOLO-World, end-to-end YOLOv10/YOLO26 heads ...), one line naming it and what is supported.
        CheckpointError: a model whose description does not fit its tensors.
    """
    model = _model_entry(obj, use_ema, source)
    qualname = model.pickled_name.rpartition(".")[2]
    task = MODEL_TASKS.get(qualname)
    if task is None:
        what = UNSUPPORTED_MODELS.get(qualname, "an Ultralytics model this library does not implement")
        raise UnsupportedCheckpointError(f"{source}: unsupported checkpoint: {what} ({model.pickled_name}); "
                                         f"{SUPPORTED}")
    layers = _layers(model)
    if not layers:
        raise CheckpointError(f"{source}: the pickled {model.pickled_name} has no layers")
    head_index = len(layers) - 1
    head = layers[head_index]
    head_name = getattr(head, "pickled_name", type(head).__name__)
    problem = _head_problem(head, head_name, task)
    if problem:
        raise UnsupportedCheckpointError(f"{source}: unsupported checkpoint: {problem}; {SUPPORTED}")
    yaml = _plain_yaml(model.get("yaml"), source)
    state = module_state_dict(model)
    nc, reg_max, stride, kpt_shape = HEAD_READERS[TASK_HEADS[task]](head, yaml, state, head_index, source)
    if yaml.get("nc") is not None and yaml.get("nc") != nc:
        raise CheckpointError(f"{source}: the model yaml says nc={yaml.get('nc')}, its head has {nc} classes")
    architecture = architecture_name(yaml)
    version = obj.get("version") if isinstance(obj, Mapping) else None
    made_by = f", ultralytics {version}" if isinstance(version, str) else ""
    kind = f"official Ultralytics {architecture or 'custom'} checkpoint ({model.pickled_name}{made_by})"
    return UltralyticsWeights(task=task, yaml=yaml, state_dict=state, names=_names(model.get("names"), nc),
                              in_channels=_in_channels(yaml, state), architecture=architecture, kind=kind, nc=nc,
                              reg_max=reg_max, stride=stride, kpt_shape=kpt_shape)


def architecture_name(yaml: Mapping[str, Any]) -> str | None:
    """``yolov8n`` from ``yaml_file`` ``yolov8n.yaml`` (or ``yolov8.yaml`` and ``scale`` ``n``), ``yolov5nu``,
    ``yolo11s-seg`` ...; None for a YAML of another name, or one whose scale is not among its ``scales``."""
    yaml_file = yaml.get("yaml_file")
    if not isinstance(yaml_file, str):
        return None
    stem = re.split(r"[\\/]", yaml_file)[-1].rsplit(".", 1)[0]
    match = _YAML_NAME.fullmatch(stem)
    if match is None:
        return None
    family, named_scale, rest = match.groups()
    scale = yaml.get("scale") or named_scale
    scales = yaml.get("scales")
    if not scale or (named_scale and scale != named_scale) or (isinstance(scales, Mapping) and scale not in scales):
        return None
    return f"{family}{scale}{rest}"


def _model_entry(obj: Any, use_ema: bool, source: str) -> PickledObject:
    """The pickled model: the dict's ``ema`` entry first (unless not ``use_ema``), else ``model``; or ``obj``."""
    if isinstance(obj, Mapping):
        keys = ("ema", "model") if use_ema else ("model", "ema")
        obj = next((obj[key] for key in keys if obj.get(key) is not None), None)
    if not (isinstance(obj, PickledObject) and obj.pickled_name.startswith(ULTRALYTICS_PREFIX)):
        raise CheckpointError(f"{source}: not an Ultralytics checkpoint (no pickled ultralytics model in it)")
    return obj


def _layers(model: PickledObject) -> list[Any]:
    body = (model.get("_modules") or {}).get("model")
    return list((body.get("_modules") or {}).values()) if isinstance(body, PickledObject) else []


def _head_problem(head: Any, head_name: str, task: str) -> str | None:
    """Why the last layer is not the plain head of ``task`` this library implements (None when it is)."""
    if isinstance(head, PickledObject) and ((head.get("_modules") or {}).get("one2one_cv2") is not None
                                            or head.get("end2end") or head.get("_end2end")):
        return (f"an end-to-end (NMS-free) model: its {head_name} head has one-to-one branches, as YOLO26 and "
                "YOLOv10 heads do")
    expected = TASK_HEADS[task]
    if not isinstance(head, PickledObject) or head_name.rpartition(".")[2] != expected:
        return f"a {task} model whose last layer is {head_name}, not Ultralytics' {expected} head"
    return None


class HeadFacts(NamedTuple):
    """What a head's reader finds: its class count, DFL bins, strides and keypoint shape (None where it has none)."""

    nc: int
    reg_max: int | None
    stride: tuple[float, ...]
    kpt_shape: tuple[int, int] | None


def _detection_head(head: PickledObject, yaml: Mapping[str, Any], state: Mapping[str, torch.Tensor], index: int,
                    source: str) -> HeadFacts:
    """The facts of a Detect/Segment head, checked against its last box and class convolutions."""
    nc, reg_max, levels = head.get("nc"), head.get("reg_max", 16), head.get("nl")
    stride = head.get("stride")
    if not (isinstance(nc, int) and isinstance(reg_max, int) and isinstance(levels, int)
            and isinstance(stride, torch.Tensor) and stride.numel() == levels > 0):
        raise CheckpointError(f"{source}: the pickled {head.pickled_name} head lacks nc, reg_max, nl or its strides")
    for level in range(levels):
        for branch, channels in (("cv2", 4 * reg_max), ("cv3", nc)):
            found = _last_conv_outputs(state, f"model.{index}.{branch}.{level}.")
            if found != channels:
                raise CheckpointError(f"{source}: the head's {branch}.{level} ends in {found} channels, {channels} "
                                      f"expected for nc={nc}, reg_max={reg_max}")
    return HeadFacts(nc, reg_max, tuple(float(s) for s in stride.float().tolist()), None)


def _pose_head(head: PickledObject, yaml: Mapping[str, Any], state: Mapping[str, torch.Tensor], index: int,
               source: str) -> HeadFacts:
    """The facts of a Pose head: a detection head's, and its ``kpt_shape``, equal to its model yaml's and to its
    keypoint convolutions' outputs."""
    facts = _detection_head(head, yaml, state, index, source)
    shape = head.get("kpt_shape")
    if not (isinstance(shape, (list, tuple)) and len(shape) == 2 and all(isinstance(v, int) for v in shape)):
        raise CheckpointError(f"{source}: the pickled {head.pickled_name} head lacks its kpt_shape")
    if list(yaml.get("kpt_shape") or []) != list(shape):
        raise CheckpointError(f"{source}: the model yaml says kpt_shape={yaml.get('kpt_shape')}, its head "
                              f"{list(shape)}")
    keypoints, dimensions = shape
    for level in range(len(facts.stride)):
        found = _last_conv_outputs(state, f"model.{index}.cv4.{level}.")
        if found != keypoints * dimensions:
            raise CheckpointError(f"{source}: the head's cv4.{level} ends in {found} channels, {keypoints * dimensions}"
                                  f" expected for kpt_shape={list(shape)}")
    return facts._replace(kpt_shape=(keypoints, dimensions))


def _obb_head(head: PickledObject, yaml: Mapping[str, Any], state: Mapping[str, torch.Tensor], index: int,
              source: str) -> HeadFacts:
    """The facts of an OBB head: a detection head's, whose angle branch ends in one channel per level."""
    facts = _detection_head(head, yaml, state, index, source)
    for level in range(len(facts.stride)):
        found = _last_conv_outputs(state, f"model.{index}.cv4.{level}.")
        if head.get("ne", 1) != 1 or found != 1:
            raise CheckpointError(f"{source}: the OBB head predicts {head.get('ne')} angles (its cv4.{level} ends in "
                                  f"{found} channels); one angle per box is supported")
    return facts


def _last_conv_outputs(state: Mapping[str, torch.Tensor], prefix: str) -> int | None:
    """Output channels of the last convolution weight under ``prefix`` (a head branch's ``nn.Sequential``)."""
    weights = [key for key in state if key.startswith(prefix) and key.endswith(".weight") and state[key].ndim == 4]
    if not weights:
        return None
    last = max(weights, key=lambda key: [int(part) for part in key[len(prefix):].split(".") if part.isdigit()])
    return int(state[last].shape[0])


def _classifier_head(head: PickledObject, yaml: Mapping[str, Any], state: Mapping[str, torch.Tensor], index: int,
                     source: str) -> HeadFacts:
    """The facts of a Classify head (its class count, from its linear layer; nothing else)."""
    linear = state.get(f"model.{index}.linear.weight")
    if linear is None or linear.ndim != 2:
        raise CheckpointError(f"{source}: the Classify head has no linear layer (model.{index}.linear.weight)")
    return HeadFacts(int(linear.shape[0]), None, (), None)


def _plain_yaml(yaml: Any, source: str) -> dict[str, Any]:
    """The pickled ``yaml`` as plain YAML values (a deep copy), refusing anything else it might hold."""
    if not isinstance(yaml, Mapping) or "backbone" not in yaml or "head" not in yaml:
        raise CheckpointError(f"{source}: the pickled model has no 'yaml' with its backbone and head")
    try:
        return _plain(yaml)
    except _NotPlain as exc:
        raise CheckpointError(f"{source}: the model yaml holds {exc}, not a plain YAML value") from None


def _plain(value: Any) -> Any:
    if isinstance(value, _PLAIN_SCALARS):
        return value
    if isinstance(value, Mapping):
        return {_plain_key(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    raise _NotPlain(f"a {type(value).__name__}")


def _plain_key(key: Any) -> Any:
    if not isinstance(key, _PLAIN_SCALARS):
        raise _NotPlain(f"a key of type {type(key).__name__}")
    return key


def _in_channels(yaml: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> int:
    """The stem convolution's input channels; else the YAML's ``channels`` (``ch`` before Ultralytics 8.1), else 3."""
    stem = state.get("model.0.conv.weight")
    if stem is not None and stem.ndim == 4:
        return int(stem.shape[1])
    channels = yaml.get("channels", yaml.get("ch", 3))
    return channels if isinstance(channels, int) else 3


def _names(names: Any, nc: int) -> list[str]:
    """The checkpoint's ``{index: name}`` names as a list; numbered names when absent or not fitting ``nc``."""
    try:
        return class_names(names, nc)
    except ValueError:
        return class_names(None, nc)


# Each head kind's reader: its facts from the pickled head, the model yaml and the model's tensors.
HEAD_READERS = {"Detect": _detection_head, "Segment": _detection_head, "OBB": _obb_head, "Pose": _pose_head,
                "Classify": _classifier_head}
