"""Model files that are programs: loading them runs code the file carries, so they need the user's trust.

A TorchScript file holds TorchScript code that the interpreter runs when it is loaded and called (that
code can call operators such as ``torch.from_file(..., shared=True)``, which create and write files of
its choosing); a TensorRT engine is compiled native code and may embed plugin libraries that run when
it is deserialized (NVIDIA: "serialized TensorRT engines are executable artifacts"). Neither is opened without
``trust_code=True`` (``--trust-model-code``). The refusal says where the file came from by reading
the metadata our exports carry as plain data: a TorchScript file is a zip archive whose extra file
``config.json`` is read with :mod:`zipfile`; an engine starts with a length-prefixed JSON header.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
import zlib
from pathlib import Path

from ..checkpoint import CheckpointError
from .formats import REGISTRY

# Suffix → why loading such a file runs code from it, from the formats' registry entries.
PROGRAM_FORMATS: dict[str, str] = {spec.suffix: spec.runs_code for spec in REGISTRY.values() if spec.runs_code}
# Largest metadata read to describe a file; ours is a few KB.
MAX_METADATA_BYTES = 1 << 20


class UntrustedModelError(CheckpointError):
    """A model file that is a program was given without ``trust_code=True`` (``--trust-model-code``)."""


def needs_trust(path: str | os.PathLike) -> bool:
    """Whether loading ``path`` (by its suffix) runs code the file carries."""
    return Path(path).suffix.lower() in PROGRAM_FORMATS


def require_trust(path: str | os.PathLike, trust_code: bool) -> None:
    """Refuse a program-format model file unless ``trust_code``; reads nothing but its metadata, as data.

    A missing file passes: there is nothing to run, and the loader reports it.

    Raises:
        UntrustedModelError: one line saying why the file is refused, where it says it came from, and
            how to accept it.
    """
    path = Path(path)
    if trust_code or not needs_trust(path) or not path.is_file():
        return
    raise UntrustedModelError(f"{path}: not loaded: {PROGRAM_FORMATS[path.suffix.lower()]}; {describe_origin(path)}; "
                              "pass --trust-model-code (Python: trust_code=True) only if you trust its source")


def describe_origin(path: Path) -> str:
    """Where a program-format file says it came from, from its metadata read without running it."""
    metadata = _torchscript_metadata(path) if path.suffix.lower() == ".torchscript" else _engine_metadata(path)
    if not isinstance(metadata, dict) or metadata.get("producer") != "yolotrain":
        return "it carries no yolotrain export metadata (it was not written by yolotrain export)"
    # Written by whoever made the file: one short line of it, whatever it holds.
    fields = {key: " ".join(str(metadata.get(key, "?")).split())[:80]
              for key in ("model", "nc", "img_size", "precision")}
    return (f"its metadata says it is a yolotrain export of {fields['model']} ({fields['nc']} classes, "
            f"image size {fields['img_size']}, {fields['precision']}), which anyone could have written")


def _torchscript_metadata(path: Path) -> object:
    """The ``config.json`` extra file of a TorchScript archive, or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            member = next((m for m in archive.infolist() if m.filename.endswith("/extra/config.json")), None)
            if member is None or member.file_size > MAX_METADATA_BYTES:
                return None
            return json.loads(archive.read(member))
    # zipfile raises NotImplementedError for compression methods it lacks: that too is unreadable metadata.
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error, ValueError, RuntimeError, NotImplementedError):
        return None


def _engine_metadata(path: Path) -> object:
    """The JSON header an engine export starts with, or None."""
    try:
        with path.open("rb") as file:
            (length,) = struct.unpack("<I", file.read(4))
            if length > MAX_METADATA_BYTES:
                return None
            return json.loads(file.read(length))
    except (OSError, struct.error, ValueError):
        return None
