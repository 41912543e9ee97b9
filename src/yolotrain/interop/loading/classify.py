"""Classifier weights: official ``yolov5*-cls.pt`` checkpoints (the reference's pickled ``ClassificationModel``,
read by the restricted unpickler without running its code) and bare classifier state dicts.

The reference pickles no architecture description with a classifier: the size comes from the stem's width
(as for a bare detector state dict), the cut from the number of layers, the class count from the head's
Linear layer; the tensors are then checked against the classifier built from those.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from ...checkpoint import CheckpointError, state_mismatch
from ...model.anchor_free import anchor_free_classifier
from ...model.anchor_free.spec import ARCHITECTURES
from ...model.classify import CLS_SUFFIX, DEFAULT_CUTOFF, Classifier
from ...names import class_names
from .official import STEM_WEIGHT, STEM_WIDTHS, UnsupportedCheckpointError, module_state_dict
from .unpickler import PickledObject

CLASSIFICATION_MODEL = "ClassificationModel"
_HEAD_LINEAR = re.compile(r"model\.(\d+)\.linear\.weight")


def _is_classifier(obj: Any) -> bool:
    """Whether ``obj`` is a YOLOv5 classifier (an Ultralytics ``ClassificationModel`` is another architecture)."""
    if isinstance(obj, PickledObject):
        if obj.pickled_name.startswith("ultralytics."):
            return False
        if obj.pickled_name.rpartition(".")[2] == CLASSIFICATION_MODEL:
            return True
        body = (obj.get("_modules") or {}).get("model")
        layers = (body.get("_modules") or {}) if isinstance(body, PickledObject) else {}
        return bool(layers) and getattr(list(layers.values())[-1], "pickled_name", "").endswith(".Classify")
    return (isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())
            and any(_HEAD_LINEAR.fullmatch(str(k)) for k in obj))


def _entry(obj: Any, use_ema: bool) -> Any:
    """The model entry of an official checkpoint dict (EMA first, as the reference serves it), else ``obj``."""
    if isinstance(obj, Mapping) and not all(isinstance(v, torch.Tensor) for v in obj.values()):
        keys = ("ema", "model") if use_ema else ("model", "ema")
        return next((obj[k] for k in keys if obj.get(k) is not None), obj)
    return obj


def read_classifier(obj: Any, source: str, use_ema: bool = True) -> Classifier | None:
    """The :class:`Classifier` an unpickled checkpoint holds (float32, eval mode, CPU), or None when it holds
    no classifier (a detector, which :func:`.official.interpret` reads).

    Raises:
        UnsupportedCheckpointError: a classifier of an architecture this library cannot rebuild, or tensors
            that do not fit the architecture they describe.
    """
    found = _entry(obj, use_ema)
    if not _is_classifier(found):
        return None
    if isinstance(found, PickledObject):
        kind = f"a YOLOv5 classification model ({found.pickled_name})"
        state, names = module_state_dict(found), found.get("names")
    else:
        kind, state, names = "a YOLOv5 classifier state dict", dict(found), None
    heads = sorted(int(m.group(1)) for m in map(_HEAD_LINEAR.fullmatch, state) if m)
    stem = state.get(STEM_WEIGHT)
    problem = _unbuildable(heads, stem)
    if problem:
        raise UnsupportedCheckpointError(f"{source}: unsupported checkpoint: {kind} {problem}")
    cutoff, nc = heads[-1] + 1, int(state[f"model.{heads[-1]}.linear.weight"].shape[0])
    size = STEM_WIDTHS[int(stem.shape[0])]
    try:
        model = Classifier.from_name(f"yolov5{size}{CLS_SUFFIX}", nc, _names(names, nc), cutoff, empty=True)
    except ValueError as exc:
        raise UnsupportedCheckpointError(f"{source}: unsupported checkpoint: {kind}: {exc}") from None
    state = {key: value.float() if value.is_floating_point() else value for key, value in state.items()}
    mismatch = state_mismatch(model.state_dict(), state)
    if mismatch:
        raise UnsupportedCheckpointError(f"{source}: does not match its tensors (yolov5{size}-cls nc={nc}: {mismatch})")
    return model.assign(state).eval()


def _unbuildable(heads: list[int], stem: torch.Tensor | None) -> str | None:
    """Why no published classifier fits these tensors (None when one does)."""
    if not heads:
        return "without a Classify head's Linear layer"
    if stem is None:
        return f"without a stem convolution ({STEM_WEIGHT})"
    if int(stem.shape[0]) not in STEM_WIDTHS:
        return f"with stem width {int(stem.shape[0])}, which matches none of yolov5n-cls … yolov5x-cls"
    return None


def _names(names: Any, nc: int) -> list[str]:
    """A checkpoint's class names, or numbered names when they are absent or do not fit ``nc``."""
    try:
        return class_names(names, nc)
    except ValueError:
        return class_names(None, nc)


def checkpoint_classifier(meta: Mapping[str, Any], state: Mapping[str, torch.Tensor], source: str) -> Classifier:
    """The :class:`Classifier` of one of our checkpoints (metadata validated by :mod:`yolotrain.checkpoint`):
    rebuilt by its ``arch`` name (YOLOv5's, YOLOv8's and YOLO11's, torchvision's), ``cutoff`` and class count,
    holding ``state`` in its saved dtype (eval mode).

    Raises:
        CheckpointError: an architecture this library cannot rebuild by name, or tensors that do not fit it.
    """
    arch, nc = meta["arch"], meta["nc"]
    try:
        model = (anchor_free_classifier(arch, nc, meta.get("names")) if arch in ARCHITECTURES else
                 Classifier.from_name(arch, nc, meta.get("names"), meta.get("cutoff") or DEFAULT_CUTOFF, empty=True))
    except ValueError as exc:
        raise CheckpointError(f"{source}: bad architecture entry ({exc})") from None
    mismatch = state_mismatch(model.state_dict(), state)
    if mismatch:
        raise CheckpointError(f"{source}: does not match its tensors ({arch} nc={nc}: {mismatch})")
    dtype = next(v.dtype for v in state.values() if v.is_floating_point())
    return model.assign({key: value.to(dtype) if value.is_floating_point() else value
                         for key, value in state.items()}).eval()
