"""Where the library keeps files it can rebuild: generated datasets and label caches of read-only datasets,
and what says a cached file is still current."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Return ``$YOLOTRAIN_CACHE`` if set, else ``~/.cache/yolotrain`` (not created here)."""
    env = os.environ.get("YOLOTRAIN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "yolotrain"


def file_signature(path: str | os.PathLike) -> str:
    """The version of a file as its status tells it, without reading it: size, modification and status-change
    times in nanoseconds, and inode (the fields git's index trusts).

    Writing a file changes its change time, which no tool can set back, and replacing it gives a new
    inode, so an edit that keeps the size and restores the modification time still changes this.

    Raises:
        OSError: the file cannot be looked at (missing, no permission).
    """
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
