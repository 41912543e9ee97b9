"""Our checkpoint format: ``NAME.safetensors`` + ``NAME.json`` (+ optional ``NAME.state.pt``).

- ``NAME.safetensors``: tensors ``model.*`` and, when given, ``ema.*`` (exact dtypes, no pickle).
- ``NAME.state.pt``: optimizer / scheduler / RNG state; must load with ``torch.load(weights_only=True)``.
- ``NAME.json``: architecture (version, nc, anchors, strides, in_channels; for a model built from a
  model YAML that is not a published architecture, ``version`` is ``custom`` and ``cfg`` holds the
  whole layer list in the reference's model-YAML form), class names, whatever
  metadata the caller passes (image size, train args, epoch, metrics ...), the format version and
  the SHA-256 of the other files.

Every file is written to a temporary name in the same folder, flushed, fsynced and renamed into
place; the json goes last and records the digests of the files written before it, so a set whose
json is present and matches is complete, and a stale or half-replaced set is reported, not loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORMAT_NAME = "yolotrain-checkpoint"
FORMAT_VERSION = 1
# Keys of the json that describe the tensors; caller metadata may not contradict them.
ARCHITECTURE_KEYS = ("version", "nc", "anchors", "strides", "in_channels", "cfg")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: missing, truncated, corrupt or inconsistent."""


@dataclass
class CheckpointContents:
    """Everything in one checkpoint set, without building a model."""

    metadata: dict[str, Any]
    model_state: dict[str, torch.Tensor]
    ema_state: dict[str, torch.Tensor] | None
    state_path: Path | None


def checkpoint_paths(path: str | Path) -> tuple[Path, Path, Path]:
    """(``.safetensors``, ``.json``, ``.state.pt``) for a stem or any of the three file names."""
    path = Path(path)
    name = path.name
    for suffix in (".safetensors", ".json", ".state.pt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    stem = path.with_name(name)
    return stem.with_name(name + ".safetensors"), stem.with_name(name + ".json"), stem.with_name(name + ".state.pt")


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_atomic(target: Path, write: Callable[[Path], None]) -> None:
    """Write via ``write(temp_path)`` in the target's folder, fsync, then rename over ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(handle)
    temp = Path(temp_name)
    try:
        write(temp)
        with temp.open("rb+") as written:
            written.flush()
            os.fsync(written.fileno())
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
    # The rename itself is durable only once the folder entry is on disk.
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _tensors_of(source: nn.Module | Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    state = source.state_dict() if isinstance(source, nn.Module) else source
    return {f"{prefix}.{key}": value.detach().cpu().contiguous() for key, value in state.items()}


def _architecture(model: nn.Module) -> dict[str, Any]:
    head = model.head
    strides = [float(s) for s in head.stride.tolist()]
    anchors = (head.anchors.detach().cpu().double() * head.stride.cpu().double().view(-1, 1, 1)).tolist()
    architecture = {"version": model.version, "nc": int(head.nc), "anchors": anchors, "strides": strides,
                    "in_channels": int(model.in_channels)}
    if model.version == "custom":  # self-contained: the layers themselves, not a path to their YAML
        architecture.update(cfg=model.spec.to_dict())
    return architecture


def _class_names(model: nn.Module, metadata: Mapping[str, Any]) -> list[str]:
    names = metadata.get("names", getattr(model, "names", None))
    nc = int(model.head.nc)
    if names is None:
        return [str(i) for i in range(nc)]
    names = [str(names[i]) for i in range(len(names))] if isinstance(names, Mapping) else [str(n) for n in names]
    if len(names) != nc:
        raise ValueError(f"{len(names)} class names given for a model with {nc} classes")
    return names


def save_checkpoint(path_stem: str | Path, model: nn.Module, ema: nn.Module | Mapping[str, torch.Tensor] | None = None,
                    *, metadata: Mapping[str, Any] | None = None, state: Mapping[str, Any] | None = None) -> Path:
    """Write a checkpoint set for ``model`` (a :class:`~yolotrain.Yolov5`); returns the json path.

    ``metadata`` must be JSON-serialisable; ``names`` in it (or ``model.names``) become the class
    names. ``state`` (optimizer, scheduler, RNG ...) is written to ``NAME.state.pt`` and must hold
    only what ``torch.load(weights_only=True)`` accepts (tensors, numbers, strings, containers).
    """
    weights_path, json_path, state_path = checkpoint_paths(path_stem)
    metadata = dict(metadata or {})
    architecture = _architecture(model)
    for key in ARCHITECTURE_KEYS:
        if key in metadata and metadata[key] != architecture.get(key):
            raise ValueError(f"metadata {key}={metadata[key]!r} contradicts the model ({architecture.get(key)!r})")
    document = {**metadata, **architecture, "names": _class_names(model, metadata),
                "format": FORMAT_NAME, "format_version": FORMAT_VERSION}
    try:
        json.dumps(document)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"checkpoint metadata is not JSON-serialisable: {exc}") from None

    tensors = _tensors_of(model, "model")
    if ema is not None:
        tensors.update(_tensors_of(ema, "ema"))
    from safetensors.torch import save_file
    _write_atomic(weights_path, lambda temp: save_file(tensors, str(temp), metadata={"format": FORMAT_NAME}))
    files = {"weights": {"name": weights_path.name, "sha256": _file_sha256(weights_path)}}

    if state is not None:
        _write_atomic(state_path, lambda temp: _save_state(dict(state), temp))
        files.update(state={"name": state_path.name, "sha256": _file_sha256(state_path)})
    else:
        # A state file left from an earlier save under this name no longer belongs to the set.
        state_path.unlink(missing_ok=True)
    document.update(files=files)
    _write_atomic(json_path, lambda temp: temp.write_text(json.dumps(document, indent=2) + "\n"))
    return json_path


def _save_state(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` then prove the file loads with ``weights_only=True`` before it is renamed into place."""
    torch.save(state, path)
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch reports unsafe globals with several exception types
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"training state would not load with torch.load(weights_only=True): {first_line} "
                         "(store numpy arrays and custom objects as tensors, numbers or strings)") from None


def read_metadata(path: str | Path) -> tuple[dict[str, Any], bool]:
    """The verified json of a checkpoint set and whether it has a training state file.

    Checks that the json exists and is ours, and that the files it lists are present with the
    recorded SHA-256 (a truncated, corrupt or mixed-up set fails here with a one-line error).
    """
    weights_path, json_path, state_path = checkpoint_paths(path)
    if not json_path.is_file():
        if weights_path.is_file():
            raise CheckpointError(f"{json_path}: missing (its {weights_path.name} is incomplete or from an "
                                  "interrupted save)")
        raise CheckpointError(f"{path}: no such checkpoint (looked for {weights_path.name} and {json_path.name})")
    try:
        metadata = json.loads(json_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{json_path}: not valid JSON ({exc})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{json_path}: not a {FORMAT_NAME} file")
    if int(metadata.get("format_version", 0)) > FORMAT_VERSION:
        raise CheckpointError(f"{json_path}: format version {metadata['format_version']} is newer than this "
                              f"yolotrain reads ({FORMAT_VERSION}); upgrade yolotrain")
    files = metadata.get("files", {})
    _verify(weights_path, files.get("weights"), json_path)
    has_state = "state" in files
    if has_state:
        _verify(state_path, files["state"], json_path)
    return metadata, has_state


def read_checkpoint(path: str | Path) -> CheckpointContents:
    """Read and verify a checkpoint set given its stem, ``.safetensors`` or ``.json`` path."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights_path, _, state_path = checkpoint_paths(path)
    metadata, has_state = read_metadata(path)
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{weights_path}: truncated or corrupt safetensors file ({exc})") from None
    model_state = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    ema_state = {k.removeprefix("ema."): v for k, v in tensors.items() if k.startswith("ema.")} or None
    if not model_state:
        raise CheckpointError(f"{weights_path}: holds no 'model.*' tensors")
    return CheckpointContents(metadata, model_state, ema_state, state_path if has_state else None)


def _verify(path: Path, record: Any, json_path: Path) -> None:
    if not isinstance(record, dict) or "sha256" not in record:
        raise CheckpointError(f"{json_path}: lists no digest for {path.name}")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (listed in {json_path.name})")
    if _file_sha256(path) != record["sha256"]:
        raise CheckpointError(f"{path}: does not match {json_path.name} (SHA-256 differs: the file was "
                              "truncated, corrupted or replaced by another save)")


def load_state(path: str | Path) -> dict[str, Any]:
    """The training state saved with a checkpoint (``torch.load(weights_only=True)``)."""
    _, has_state = read_metadata(path)
    if not has_state:
        raise CheckpointError(f"{path}: checkpoint has no training state")
    return torch.load(checkpoint_paths(path)[2], map_location="cpu", weights_only=True)


def state_mismatch(expected: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor]) -> str | None:
    """Why ``weights`` cannot load into a model whose state dict is ``expected`` (None when it can)."""
    missing = sorted(set(expected) - set(weights))
    if missing:
        return f"{len(missing)} missing tensors, e.g. {missing[0]}"
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        return f"{len(unexpected)} unexpected tensors, e.g. {unexpected[0]}"
    for key, value in expected.items():
        if value.shape != weights[key].shape:
            return f"{key} has shape {tuple(weights[key].shape)}, expected {tuple(value.shape)}"
    return None


def load_checkpoint(path: str | Path, *, use_ema: bool = True) -> tuple[nn.Module, dict[str, Any]]:
    """Build a :class:`~yolotrain.Yolov5` from a checkpoint set; returns ``(model, metadata)``.

    The EMA weights are used when present and ``use_ema`` (they are the ones evaluated during
    training). The model is float32 or whatever dtype was saved, on the CPU, in eval mode, with
    ``model.names`` set from the metadata.
    """
    from .model import ModelSpec, Yolov5

    contents = read_checkpoint(path)
    meta = contents.metadata
    _, json_path, _ = checkpoint_paths(path)
    try:
        architecture = ModelSpec.from_mapping(meta["cfg"], f"{json_path} cfg") if "cfg" in meta else meta["version"]
        model = Yolov5(architecture, num_classes=meta["nc"], anchors=meta["anchors"],
                       in_channels=meta.get("in_channels", 3))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{json_path}: bad architecture entry ({type(exc).__name__}: {exc})") from None
    weights = contents.ema_state if use_ema and contents.ema_state is not None else contents.model_state
    mismatch = state_mismatch(model.state_dict(), weights)
    if mismatch:
        raise CheckpointError(f"{json_path}: does not match its tensors (yolov5{meta['version']} nc={meta['nc']}: "
                              f"{mismatch})")
    # Keep the saved floating dtype so that a save/load round trip is bitwise exact.
    model = model.to(next(v.dtype for v in weights.values() if v.is_floating_point()))
    model.load_state_dict(weights, strict=True)
    model.names = list(meta.get("names") or [str(i) for i in range(model.num_classes)])
    return model.eval(), meta
