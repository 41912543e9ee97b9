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
    try:  # mkstemp makes 0600 files; give the mode a plain open() would (0666 less the umask)
        os.fchmod(handle, 0o666 & ~current_umask())
    finally:
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


def current_umask() -> int:
    """This process's umask, read without changing it where Linux reports it (``os.umask`` can only be read
    by setting it, which would race with other threads creating files)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
