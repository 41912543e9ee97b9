"""Atomic file writes: a reader sees the old file or the complete new one, never a partial file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomic(target: str | os.PathLike, write: Callable[[Path], None], durable: bool = True) -> Path:
    """Write ``target`` through ``write(temp_path)`` in the same folder, then rename it into place.

    The temporary file is hidden (``.NAME.*.tmp``) and removed when ``write`` fails. With ``durable``
    the file and the folder entry are fsynced, so the new content survives a power loss once this
    returns; caches that are cheap to rebuild skip that cost.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(handle)
    temp = Path(temp_name)
    try:
        write(temp)
        if durable:
            with temp.open("rb+") as written:
                os.fsync(written.fileno())
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
    if durable:
        # The rename itself is durable only once the folder entry is on disk.
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return target
