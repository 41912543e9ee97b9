"""Anchor-free models (YOLOv5u, YOLOv8, YOLO11) from files: official Ultralytics checkpoints (read as data by
:mod:`.ultralytics`), our own checkpoints of them, and model YAMLs or names in the Ultralytics format.

A model YAML is Ultralytics' when it has no ``anchors`` (its Detect takes ``[nc]``): YOLOv5's own YAMLs always
give anchors, so the one key tells the two formats apart.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...checkpoint import CheckpointError, state_mismatch
from ...model.anchor_free import AnchorFreeSpec, AnchorFreeYolo, anchor_free_classifier, builtin_spec
from ...model.anchor_free.spec import ARCHITECTURES
from ...model.classify import Classifier
from ...names import class_names
from ...yamlio import read_yaml_document
from .official import UnsupportedCheckpointError
from .ultralytics import UltralyticsWeights

CLASSIFY_HEAD = "Classify"
POSE_HEAD = "Pose"
CLASSIFY_SUFFIX = "-cls"


def is_anchor_free_name(name: str | os.PathLike) -> bool:
    """Whether ``name`` (any case, ``.yaml`` or ``.pt`` dropped) is a published anchor-free architecture:
    ``yolov8n``, ``yolo11s-seg``, ``yolov5nu``, ``yolov8n-cls``, ``yolov8n-pose``, ``yolov5nu-pose`` …"""
    key = os.path.basename(os.fspath(name)).lower()
    for suffix in (".yaml", ".yml", ".pt"):
        key = key.removesuffix(suffix)
    return key in ARCHITECTURES


def is_anchor_free_classifier_name(name: str | os.PathLike) -> bool:
    """Whether ``name`` is a published anchor-free classifier (``yolov8n-cls``, ``yolo11s-cls.yaml`` …) that is no
    file."""
    return is_anchor_free_name(name) and not os.path.exists(name) and \
        os.path.splitext(os.path.basename(os.fspath(name)))[0].lower().endswith(CLASSIFY_SUFFIX)


def is_anchor_free_yaml(path: str | os.PathLike) -> bool:
    """Whether the model YAML at ``path`` is in Ultralytics' anchor-free format (a mapping without ``anchors``)."""
    cfg, _ = read_yaml_document(os.fspath(path))
    return isinstance(cfg, Mapping) and "anchors" not in cfg and "backbone" in cfg


def build_architecture(spec: AnchorFreeSpec, num_classes: int | None, names: Sequence[str] | None,
                       kpt_shape: Sequence[int] | None = None) -> AnchorFreeYolo | Classifier:
    """``spec``'s model with random weights (a classifier when its head is Classify); ``num_classes`` overrides its
    ``nc``, ``kpt_shape`` (keypoints, values each) a Pose head's."""
    nc = spec.nc if num_classes is None else num_classes
    if kpt_shape is not None:
        if spec.head_block != POSE_HEAD:
            raise ValueError(f"kpt_shape is for a Pose head; {spec.where()} ends in {spec.head_block}")
        spec = dataclasses.replace(spec, kpt_shape=tuple(int(v) for v in kpt_shape))
    return ARCHITECTURE_BUILDERS.get(spec.head_block, _box_model)(spec, nc, names)


def _box_model(spec: AnchorFreeSpec, num_classes: int, names: Sequence[str] | None) -> AnchorFreeYolo:
    return AnchorFreeYolo(spec, num_classes=num_classes, names=names)


# How a spec is built by its head block: a Classify head makes a Classifier, any other (Detect, Segment, Pose with the
# spec's kpt_shape; what else AnchorFreeYolo refuses in one line) an AnchorFreeYolo.
ARCHITECTURE_BUILDERS = {CLASSIFY_HEAD: anchor_free_classifier}


def published_architecture(name: str, num_classes: int | None, names: Sequence[str] | None,
                           kpt_shape: Sequence[int] | None = None) -> AnchorFreeYolo | Classifier:
    """The published architecture ``name`` with random weights (COCO's 80 classes, ImageNet's 1000 for a
    classifier, COCO's person and its 17 keypoints for a pose model, unless ``num_classes`` and ``kpt_shape``)."""
    return build_architecture(builtin_spec(name), num_classes, names, kpt_shape)


def from_ultralytics(weights: UltralyticsWeights, source: str) -> AnchorFreeYolo | Classifier:
    """The model of an official Ultralytics checkpoint, in eval mode and float32, its names set.

    Raises:
        UnsupportedCheckpointError: an architecture this library cannot build, or tensors that do not fit it.
    """
    try:
        spec = AnchorFreeSpec.from_mapping(weights.yaml, f"{source} yaml", scale=weights.yaml.get("scale"))
    except (TypeError, ValueError) as exc:
        raise UnsupportedCheckpointError(f"{source}: bad architecture entry ({exc})") from None
    state = {key: value.float() if value.is_floating_point() else value for key, value in weights.state_dict.items()}
    return _loaded(spec, weights.nc, weights.names, weights.in_channels, state, source, weights.kind,
                   UnsupportedCheckpointError)


def checkpoint_anchor_free(meta: Mapping[str, Any], state: Mapping[str, torch.Tensor],
                           json_path: str) -> AnchorFreeYolo:
    """The model of one of our checkpoints of an anchor-free model (metadata validated), holding ``state`` in its
    saved dtype (eval mode).

    Raises:
        CheckpointError: an architecture this library cannot build, or tensors that do not fit it.
    """
    try:
        spec = (AnchorFreeSpec.from_mapping(meta["cfg"], f"{json_path} cfg") if "cfg" in meta
                else builtin_spec(meta["version"]))
        if meta.get("kpt_shape") is not None:  # a published pose architecture trained on other keypoints
            spec = dataclasses.replace(spec, kpt_shape=tuple(int(v) for v in meta["kpt_shape"]))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{json_path}: bad architecture entry ({type(exc).__name__}: {exc})") from None
    return _loaded(spec, meta["nc"], meta.get("names"), meta.get("in_channels", 3), dict(state), json_path,
                   f"{meta['version']} nc={meta['nc']}", CheckpointError)


def _loaded(spec: AnchorFreeSpec, nc: int, names: Sequence[str] | None, in_channels: int,
            state: dict[str, torch.Tensor], source: str, kind: str,
            error: type[Exception]) -> AnchorFreeYolo | Classifier:
    """``spec``'s model for ``nc`` classes holding ``state`` (in its dtype), in eval mode; ``error`` (one line naming
    ``source``) when it cannot be built or the tensors do not fit."""
    try:
        spec.in_channels = int(in_channels)
        model = build_architecture(spec, nc, None)
    except (TypeError, ValueError) as exc:
        raise error(f"{source}: bad architecture entry ({type(exc).__name__}: {exc})") from None
    mismatch = state_mismatch(model.state_dict(), state)
    if mismatch:
        raise error(f"{source}: does not match its tensors ({kind}: {mismatch})")
    try:
        model.names = class_names(names, nc)
    except ValueError as exc:
        raise error(f"{source}: {exc}") from None
    dtype = next((v.dtype for v in state.values() if v.is_floating_point()), torch.float32)
    model = model.to(dtype)
    model.load_state_dict(state, strict=True)
    return model.eval()
