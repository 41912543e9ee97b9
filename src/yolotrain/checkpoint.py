"""Our checkpoint format: ``NAME.safetensors`` + ``NAME.json`` (+ optional ``NAME.state.pt``).

- ``NAME.safetensors``: tensors ``model.*`` and, when given, ``ema.*`` (exact dtypes, no pickle).
- ``NAME.state.pt``: optimizer / scheduler / RNG state; must load with ``torch.load(weights_only=True)``.
- ``NAME.json``: architecture (version, nc, anchors, strides, in_channels; for a model built from a
  model YAML that is not a published architecture, ``version`` is ``custom`` and ``cfg`` holds the
  whole layer list in the reference's model-YAML form; a classifier's: ``task: classify``, ``arch``, ``cutoff``,
  nc, in_channels), class names, whatever
  metadata the caller passes (image size, train args, epoch, metrics ...), the format version and
  the SHA-256 of the other files.

A set is replaced as a whole. The new data files are written under temporary names and fsynced; the
files of the current set are then kept aside as ``.NAME.safetensors.prev`` (and ``.state.pt.prev``),
the new files renamed into place, and the json, which records the digest of each file, renamed
last. A kill at any moment therefore leaves either the old json with the old files (in place or
kept aside) or the new json with the new files: readers take each file the json lists from its
place or, failing the digest there, from the kept-aside copy, with a warning. The next save puts
back what an interrupted one left aside, then removes leftovers (``.prev``, ``.tmp``).

``YOLOTRAIN_KILL_AT=POINT:N`` (testing only) kills the process with SIGKILL the N-th time a save
reaches ``POINT`` (``written``, ``set-aside``, ``renamed``, ``committed``), so tests can hit each
window of a save deterministically.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .atomic import current_umask, write_atomic
from .messages import brief, shorten
from .model.spec import MAX_CLASSES, ModelSpec, check_spec
from .names import class_names
from .task import Task, get_task, task_names

FORMAT_NAME = "yolotrain-checkpoint"
FORMAT_VERSION = 1
# Bounds on what a checkpoint json may claim, checked before anything is built from it.
MAX_JSON_BYTES = 64 << 20
PREV_SUFFIX = ".prev"
# Keys of the json that describe the tensors; caller metadata may not contradict them.
ARCHITECTURE_KEYS = ("version", "nc", "anchors", "strides", "in_channels", "cfg")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: missing, truncated, corrupt or inconsistent."""


class CheckpointWarning(UserWarning):
    """A checkpoint was read from the copy an interrupted save kept aside."""


_fault_counts: Counter[str] = Counter()


def _fault_point(point: str) -> None:
    """Die here when ``YOLOTRAIN_KILL_AT`` names this point (tests of interrupted saves)."""
    spec = os.environ.get("YOLOTRAIN_KILL_AT", "")
    if spec.partition(":")[0] != point:
        return
    _fault_counts[point] += 1
    if _fault_counts[point] == int(spec.partition(":")[2] or 1):
        os.kill(os.getpid(), signal.SIGKILL)


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


def _tensors_of(source: nn.Module | Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    state = source.state_dict() if isinstance(source, nn.Module) else source
    return {f"{prefix}.{key}": value.detach().cpu().contiguous() for key, value in state.items()}


def _task_of(model: nn.Module) -> Task:
    """The task of a model to save (a module without a ``task`` is a detector)."""
    return get_task(getattr(model, "task", "detect"))


def _architecture(model: nn.Module) -> dict[str, Any]:
    return _task_of(model).checkpoint_architecture(model)


def _checkpoint_names(model: nn.Module, metadata: Mapping[str, Any]) -> list[str]:
    nc = _task_of(model).checkpoint_num_classes(model)
    return class_names(metadata.get("names", getattr(model, "names", None)), int(nc))


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
    document = {**metadata, **architecture, "names": _checkpoint_names(model, metadata),
                "format": FORMAT_NAME, "format_version": FORMAT_VERSION}
    try:
        json.dumps(document)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"checkpoint metadata is not JSON-serialisable: {exc}") from None

    tensors = _tensors_of(model, "model")
    if ema is not None:
        tensors.update(_tensors_of(ema, "ema"))
    from safetensors.torch import save_file

    json_path.parent.mkdir(parents=True, exist_ok=True)
    _recover(json_path)
    temps: dict[Path, Path] = {}
    try:
        temps[weights_path] = _write_temp(weights_path, lambda temp: save_file(
            tensors, str(temp), metadata={"format": FORMAT_NAME}))
        if state is not None:
            temps[state_path] = _write_temp(state_path, lambda temp: _save_state(dict(state), temp))
        files = {"weights": {"name": weights_path.name, "sha256": _file_sha256(temps[weights_path])}}
        if state is not None:
            files["state"] = {"name": state_path.name, "sha256": _file_sha256(temps[state_path])}
        document.update(files=files)
        _fault_point("written")
        for final in (weights_path, state_path):
            if final.exists():
                os.replace(final, _prev(final))
        _fsync_folder(json_path.parent)
        _fault_point("set-aside")
        for final, temp in temps.items():
            os.replace(temp, final)
        _fsync_folder(json_path.parent)
        _fault_point("renamed")
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)
    write_atomic(json_path, lambda temp: temp.write_text(json.dumps(document, indent=2) + "\n"))
    _fault_point("committed")
    for final in (weights_path, state_path):
        _prev(final).unlink(missing_ok=True)
    return json_path


def _prev(path: Path) -> Path:
    return path.with_name(f".{path.name}{PREV_SUFFIX}")


def _write_temp(target: Path, write) -> Path:
    """``write(temp)`` to a hidden temporary file beside ``target``, fsynced; returns its path."""
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        write(temp)
        with temp.open("rb+") as written:
            os.fchmod(written.fileno(), 0o666 & ~current_umask())  # safetensors writes 0600 files
            os.fsync(written.fileno())
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def _fsync_folder(folder: Path) -> None:
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _recover(json_path: Path) -> None:
    """Before a save: put back files an interrupted save set aside, then drop its leftovers."""
    stem = json_path.name.removesuffix(".json")
    records = {}
    if json_path.is_file():
        try:
            records = _file_records(json.loads(json_path.read_text()), json_path)
        except (OSError, ValueError, RecursionError, CheckpointError):
            records = {}
    for record in records.values():
        final = json_path.with_name(record["name"])
        kept = _prev(final)
        if kept.is_file() and not (final.is_file() and _file_sha256(final) == record["sha256"]) \
                and _file_sha256(kept) == record["sha256"]:
            os.replace(kept, final)
    for leftover in json_path.parent.glob(f".{stem}.*"):
        if leftover.name.endswith((".tmp", PREV_SUFFIX)) and leftover.is_file():
            leftover.unlink(missing_ok=True)


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

    Checks that the json exists, is ours and well-formed (every field's type and range, before
    anything is built from it), and that the files it lists are present with the recorded SHA-256
    (a truncated, corrupt or mixed-up set fails here with a one-line error).
    """
    return _read_set(path)[:2]


def _read_set(path: str | Path) -> tuple[dict[str, Any], bool, dict[str, Path]]:
    weights_path, json_path, _ = checkpoint_paths(path)
    if not json_path.is_file():
        if weights_path.is_file() or _prev(weights_path).is_file():
            raise CheckpointError(f"{json_path}: missing (its {weights_path.name} is incomplete or from an "
                                  "interrupted first save)")
        raise CheckpointError(f"{path}: no such checkpoint (looked for {weights_path.name} and {json_path.name})")
    try:
        if json_path.stat().st_size > MAX_JSON_BYTES:
            raise CheckpointError(f"{json_path}: {json_path.stat().st_size} bytes, more than a checkpoint json holds")
        metadata = json.loads(json_path.read_text(), object_pairs_hook=_unique_keys)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{json_path}: not valid JSON ({exc})") from None
    except _DuplicateKey as exc:
        raise CheckpointError(f"{json_path}: key {brief(exc.args[0])} given twice in one object (which one counts "
                              "is unclear: the file was edited)") from None
    except RecursionError:
        raise CheckpointError(f"{json_path}: not valid JSON (nested too deeply)") from None
    validate_metadata(metadata, json_path)
    located = {kind: _locate(json_path, record) for kind, record in _file_records(metadata, json_path).items()}
    return metadata, "state" in located, located


class _DuplicateKey(Exception):
    """A JSON object that names a key twice (``json`` would keep the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


def _file_records(metadata: Any, json_path: Path) -> dict[str, dict[str, str]]:
    """The ``files`` entry of a checkpoint json, checked: plain names of this set with a SHA-256 each."""
    files = metadata.get("files") if isinstance(metadata, dict) else None
    if not isinstance(files, dict) or not isinstance(files.get("weights"), dict):
        raise CheckpointError(f"{json_path}: field 'files' must list the weights file and its digest")
    stem = json_path.name.removesuffix(".json")
    records = {}
    for kind, record in files.items():
        if kind not in ("weights", "state"):
            raise CheckpointError(f"{json_path}: field 'files' lists an unknown file kind {str(kind)[:40]!r}")
        name, digest = (record.get("name"), record.get("sha256")) if isinstance(record, dict) else (None, None)
        expected = f"{stem}.safetensors" if kind == "weights" else f"{stem}.state.pt"
        if name != expected:
            raise CheckpointError(f"{json_path}: field 'files.{kind}.name' must be {expected!r}")
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise CheckpointError(f"{json_path}: field 'files.{kind}.sha256' is not a SHA-256 digest")
        records[kind] = {"name": name, "sha256": digest}
    return records


def _locate(json_path: Path, record: dict[str, str]) -> Path:
    """The file a json record names: in place, or the copy an interrupted save kept aside."""
    final = json_path.with_name(record["name"])
    if final.is_file() and _file_sha256(final) == record["sha256"]:
        return final
    kept = _prev(final)
    if kept.is_file() and _file_sha256(kept) == record["sha256"]:
        warnings.warn(f"{final}: an interrupted save replaced it; reading the previous complete set's copy "
                      f"{kept.name}", CheckpointWarning, stacklevel=4)
        return kept
    if not final.is_file():
        raise CheckpointError(f"{final}: missing (listed in {json_path.name})")
    raise CheckpointError(f"{final}: does not match {json_path.name} (SHA-256 differs: the file was "
                          "truncated, corrupted or replaced by another save)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and abs(value) != float("inf")


def validate_metadata(metadata: Any, json_path: Path) -> None:
    """Check every field a reader relies on, with bounds, so that an edited or hostile json gives one
    line naming the field instead of a traceback or a huge allocation."""
    def bad(field: str, why: str) -> CheckpointError:
        return CheckpointError(f"{json_path}: field '{field}' {why}")

    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{json_path}: not a {FORMAT_NAME} file")
    version = metadata.get("format_version")
    if not _is_int(version) or version < 1:
        raise bad("format_version", f"must be a positive integer, got {str(version)[:40]}")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{json_path}: format version {version} is newer than this yolotrain reads "
                              f"({FORMAT_VERSION}); upgrade yolotrain")
    nc = metadata.get("nc")
    if not _is_int(nc) or not 1 <= nc <= MAX_CLASSES:
        raise bad("nc", f"must be an integer from 1 to {MAX_CLASSES}, got {str(nc)[:40]}")
    names = metadata.get("names")
    if not isinstance(names, list) or len(names) != nc or not all(isinstance(n, str) for n in names):
        raise bad("names", f"must be a list of {nc} class names")
    task = metadata.get("task", "detect")
    if not (isinstance(task, str) and task in task_names()):
        raise bad("task", f"must be one of {', '.join(task_names())}, got {str(task)[:40]}")
    get_task(task).validate_checkpoint(metadata, bad)


def validate_detector_metadata(metadata: dict[str, Any], bad: Callable[[str, str], CheckpointError]) -> None:
    """The architecture fields of a detector's (or a segmentation model's) checkpoint: its version, anchors,
    strides, input channels and, for a custom layout, its layers."""
    nc = metadata["nc"]
    if not isinstance(metadata.get("version"), str) or not 0 < len(metadata["version"]) <= 16:
        raise bad("version", "must be a model size such as 'n' or 's'")
    anchors = metadata.get("anchors")
    if not (isinstance(anchors, list) and 1 <= len(anchors) <= 8 and all(
            isinstance(level, list) and 1 <= len(level) <= 16 and all(
                isinstance(a, list) and len(a) == 2 and all(_is_number(v) and v > 0 for v in a) for a in level)
            for level in anchors)):
        raise bad("anchors", "must be a list of levels of (width, height) pairs of positive numbers")
    strides = metadata.get("strides")
    if not (isinstance(strides, list) and len(strides) == len(anchors)
            and all(_is_number(v) and v > 0 for v in strides)):
        raise bad("strides", "must hold one positive number per anchor level")
    in_channels = metadata.get("in_channels", 3)
    if not _is_int(in_channels) or not 1 <= in_channels <= 64:
        raise bad("in_channels", f"must be an integer from 1 to 64, got {str(in_channels)[:40]}")
    for field in ("epoch", "img_size", "ema_updates"):
        if field in metadata and not _is_int(metadata[field]):
            raise bad(field, f"must be an integer, got {str(metadata[field])[:40]}")
    if "cfg" in metadata:  # a custom layout: its layers are checked as a model YAML's are, nothing allocated
        try:
            check_spec(ModelSpec.from_mapping(metadata["cfg"], "cfg"), nc, in_channels)
        except (TypeError, ValueError) as exc:
            raise bad("cfg", f"is not a valid architecture ({shorten(str(exc), 300)})") from None


def validate_classifier_metadata(metadata: dict[str, Any], bad: Callable[[str, str], CheckpointError]) -> None:
    """The architecture fields of a classifier's checkpoint: its name and where a YOLOv5 backbone was cut."""
    arch = metadata.get("arch")
    if not isinstance(arch, str) or not 0 < len(arch) <= 64:
        raise bad("arch", "must be a classifier name such as 'yolov5s-cls' or 'resnet18'")
    cutoff = metadata.get("cutoff")
    if not (cutoff is None or (_is_int(cutoff) and 2 <= cutoff <= 64)):
        raise bad("cutoff", f"must be null or an integer from 2 to 64, got {str(cutoff)[:40]}")
    for field in ("epoch", "img_size", "ema_updates", "in_channels"):
        if field in metadata and not _is_int(metadata[field]):
            raise bad(field, f"must be an integer, got {str(metadata[field])[:40]}")


def read_checkpoint(path: str | Path) -> CheckpointContents:
    """Read and verify a checkpoint set given its stem, ``.safetensors`` or ``.json`` path."""
    metadata, has_state, located = _read_set(path)
    weights_path = located["weights"]
    tensors = read_safetensors(weights_path)
    model_state = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    ema_state = {k.removeprefix("ema."): v for k, v in tensors.items() if k.startswith("ema.")} or None
    if not model_state:
        raise CheckpointError(f"{weights_path}: holds no 'model.*' tensors")
    return CheckpointContents(metadata, model_state, ema_state, located.get("state"))


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a ``.safetensors`` file; a truncated or corrupt one is a one-line :class:`CheckpointError`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: truncated or corrupt safetensors file ({exc})") from None


def load_state(path: str | Path) -> dict[str, Any]:
    """The training state saved with a checkpoint (``torch.load(weights_only=True)``)."""
    _, has_state, located = _read_set(path)
    if not has_state:
        raise CheckpointError(f"{path}: checkpoint has no training state")
    try:
        state = torch.load(located["state"], map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch reports unreadable files with many exception types
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CheckpointError(f"{located['state']}: not a readable training state ({first_line[:200]})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{located['state']}: not a training state (a {type(state).__name__})")
    return state


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
