"""Models from weights files: ``load_model``, one entry point for every weights file a user may hold,
and ``load_checkpoint`` for our own checkpoint sets. Every model is built by :func:`build_detector`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ...checkpoint import CheckpointError, checkpoint_paths, read_checkpoint, read_safetensors, state_mismatch
from ...model import ModelSpec, Yolov5
from ...model.classify import Classifier
from ...names import class_names
from ...task import get_task
from ..backends import is_exported
from .anchor_free import from_ultralytics
from .classify import read_classifier
from .hub import resolve_weights
from .official import PROTO_WEIGHT, DetectorWeights, UnsupportedCheckpointError, from_state_dict, interpret
from .ultralytics import is_ultralytics_checkpoint, read_ultralytics
from .unpickler import read_torch_file


def build_detector(weights: DetectorWeights, source: str, error: type[Exception] = UnsupportedCheckpointError,
                   dtype: torch.dtype = torch.float32) -> Yolov5:
    """A :class:`Yolov5` in eval mode holding ``weights`` in ``dtype`` (with ``model.names`` set).

    Raises:
        error: the architecture cannot be built, or the tensors do not fit it (the message starts
            with ``source`` and names the first tensor that does not fit).
    """
    try:
        model = Yolov5(weights.architecture, num_classes=weights.nc, anchors=weights.anchors,
                       in_channels=weights.in_channels)
    except (TypeError, ValueError) as exc:
        raise error(f"{source}: bad architecture entry ({type(exc).__name__}: {exc})") from None
    state = {key: value.to(dtype) if value.is_floating_point() else value for key, value in weights.state_dict.items()}
    mismatch = state_mismatch(model.state_dict(), state)
    if mismatch:
        raise error(f"{source}: does not match its tensors ({weights.kind}: {mismatch})")
    try:
        model.names = class_names(weights.names, model.num_classes)
    except ValueError as exc:
        raise error(f"{source}: {exc}") from None
    model = model.to(dtype)
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_checkpoint(path: str | Path, *, use_ema: bool = True) -> tuple[Yolov5 | Classifier, dict[str, Any]]:
    """Build the model of one of our checkpoint sets (a :class:`~yolotrain.Yolov5`, or what its ``task``
    rebuilds: :meth:`yolotrain.task.Task.rebuild_checkpoint`); returns ``(model, metadata)``.

    The EMA weights are used when present and ``use_ema`` (they are the ones evaluated during
    training). The model keeps the saved floating dtype (so a save/load round trip is bitwise exact),
    is on the CPU, in eval mode, with ``model.names`` set from the metadata.
    """
    contents = read_checkpoint(path)
    meta = contents.metadata
    _, json_path, _ = checkpoint_paths(path)
    state = contents.ema_state if use_ema and contents.ema_state is not None else contents.model_state
    return get_task(meta.get("task", "detect")).rebuild_checkpoint(meta, state, str(json_path)), meta


def checkpoint_detector(meta: Mapping[str, Any], state: Mapping[str, torch.Tensor], json_path: str) -> Yolov5:
    """The :class:`Yolov5` of one of our checkpoints (metadata validated by :mod:`yolotrain.checkpoint`): its
    architecture and anchors, holding ``state`` in its saved dtype (eval mode).

    Raises:
        CheckpointError: an architecture this library cannot build, or tensors that do not fit it.
    """
    if not isinstance(meta, Mapping) or any(key not in meta for key in ("version", "nc", "anchors")):
        raise CheckpointError(f"{json_path}: bad architecture entry (needs version, nc and anchors)")
    spec = None
    if "cfg" in meta:  # a custom layout carries its layers
        try:
            spec = ModelSpec.from_mapping(meta["cfg"], f"{json_path} cfg")
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{json_path}: bad architecture entry ({type(exc).__name__}: {exc})") from None
    weights = DetectorWeights(meta["version"], meta["nc"], meta["anchors"], meta.get("names"), state,
                              f"yolov5{meta['version']} nc={meta['nc']}", spec, meta.get("in_channels", 3))
    head_mismatch = _head_mismatch(state, meta["nc"], len(meta["anchors"][0]))
    if head_mismatch:  # checked before building: a json may claim any class count
        raise CheckpointError(f"{json_path}: does not match its tensors ({weights.kind}: {head_mismatch})")
    dtype = next(v.dtype for v in state.values() if v.is_floating_point())
    return build_detector(weights, json_path, CheckpointError, dtype)


def _head_mismatch(state: Mapping[str, torch.Tensor], nc: int, na: int) -> str | None:
    """Why the Detect convolutions in ``state`` cannot predict ``nc`` classes with ``na`` anchors."""
    heads = [key for key in state if re.fullmatch(r"model\.\d+\.m\.\d+\.weight", key)]
    if not heads:
        return "no Detect head tensors"
    last_layer = max(int(key.split(".")[1]) for key in heads)
    outputs = {int(state[key].shape[0]) for key in heads if int(key.split(".")[1]) == last_layer}
    proto = state.get(f"model.{last_layer}.{PROTO_WEIGHT}")  # a Segment head's masks follow the classes
    masks = int(proto.shape[0]) if proto is not None and proto.ndim else 0
    expected = na * (nc + 5 + masks)
    if outputs != {expected}:
        terms = "5 + nc + masks" if masks else "5 + nc"
        return f"the head has {sorted(outputs)[0]} outputs per cell, {na} anchors x ({terms}) = {expected} expected"
    return None


def load_model(path: str | Path, *, use_ema: bool = True) -> Yolov5 | Classifier:
    """Load a :class:`Yolov5` (eval mode, CPU, float32 unless our checkpoint stored another dtype), or a
    :class:`~yolotrain.model.classify.Classifier` from an official ``yolov5*-cls.pt`` or a classifier state dict.

    Accepts our checkpoints (stem, ``.safetensors`` or ``.json`` of a set), a bare ``state_dict``
    (``.pt`` or ``.safetensors``), and official ultralytics YOLOv5 v6.0+ detection checkpoints,
    which are read without running any pickled code (see :mod:`.unpickler`). EMA weights are used
    when present and ``use_ema``. Class names are on ``model.names``. A bare official name such as
    ``yolov5s.pt`` that is not a file here comes from the weights folder, downloaded and verified
    there when missing (see :mod:`.hub`).
    """
    path = resolve_weights(path)
    weights_path, json_path, _ = checkpoint_paths(path)
    if path.suffix == ".json" or (path.suffix in ("", ".safetensors") and json_path.is_file()):
        return load_checkpoint(path, use_ema=use_ema)[0]
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    if is_exported(path):  # never parsed as a torch file: a TorchScript archive is a program
        raise CheckpointError(f"{path}: an exported model, not a torch checkpoint: run it with "
                              "yolotrain.interop.load_exported (or val and predict)")
    source = str(path)
    contents = read_safetensors(path) if path.suffix == ".safetensors" else read_torch_file(path)
    if is_ultralytics_checkpoint(contents):
        return from_ultralytics(read_ultralytics(contents, source, use_ema=use_ema), source)
    classifier = read_classifier(contents, source, use_ema=use_ema)
    if classifier is not None:
        return classifier
    if path.suffix == ".safetensors":
        return build_detector(from_state_dict(contents, source), source)
    return build_detector(interpret(contents, source, use_ema=use_ema), source)
