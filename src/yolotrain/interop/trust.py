"""Model files that are programs: loading them runs code the file carries, so they need the user's trust.

A TorchScript file holds TorchScript code that the interpreter runs when it is loaded and called (that
code can call operators such as ``torch.from_file(..., shared=True)``, which create and write files of
its choosing); a TensorRT engine is compiled native code and may embed plugin libraries that run when
it is deserialized (NVIDIA: "serialized TensorRT engines are executable artifacts"). Neither is opened without
``trust_code=True`` (``--trust-model-code``). The refusal says where the file came from by reading
the metadata our exports carry as plain data (each format's ``read_metadata``): a TorchScript file is a
zip archive whose extra file ``config.json`` is read with :mod:`zipfile`; an engine starts with a
length-prefixed JSON header.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..checkpoint import CheckpointError

# The registry is read when a file is checked, not at import: the backends of the program formats, in the
# format modules the registry imports while it is built, import this module.
from . import formats


class UntrustedModelError(CheckpointError):
    """A model file that is a program was given without ``trust_code=True`` (``--trust-model-code``)."""


def needs_trust(path: str | os.PathLike) -> bool:
    """Whether loading ``path`` (by its suffix) runs code the file carries."""
    return _runs_code(formats.suffix_of(path)) is not None


def _runs_code(suffix: str) -> str | None:
    """Why loading a file of ``suffix`` runs code from it (its format's ``runs_code``), or None."""
    spec = formats.BY_SUFFIX.get(suffix)
    return spec.runs_code if spec is not None else None


def require_trust(path: str | os.PathLike, trust_code: bool) -> None:
    """Refuse a program-format model file unless ``trust_code``; reads nothing but its metadata, as data.

    A missing file passes: there is nothing to run, and the loader reports it.

    Raises:
        UntrustedModelError: one line saying why the file is refused, where it says it came from, and
            how to accept it.
    """
    path = Path(path)
    if trust_code or not needs_trust(path) or not path.exists():
        return
    raise UntrustedModelError(f"{path}: not loaded: {_runs_code(formats.suffix_of(path))}; {describe_origin(path)}; "
                              "pass --trust-model-code (Python: trust_code=True) only if you trust its source")


def describe_origin(path: Path) -> str:
    """Where a program-format file says it came from, from its metadata read without running it."""
    metadata = formats.export_metadata_of(path, formats.BY_SUFFIX[formats.suffix_of(path)])
    if metadata is None:
        return "it carries no yolotrain export metadata (it was not written by yolotrain export)"
    # Written by whoever made the file: one short line of it, whatever it holds.
    fields = {key: " ".join(str(metadata.get(key, "?")).split())[:80]
              for key in ("model", "nc", "img_size", "precision")}
    return (f"its metadata says it is a yolotrain export of {fields['model']} ({fields['nc']} classes, "
            f"image size {fields['img_size']}, {fields['precision']}), which anyone could have written")
