"""Where the library keeps files it can rebuild: generated datasets and label caches of read-only datasets."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Return ``$YOLOTRAIN_CACHE`` if set, else ``~/.cache/yolotrain`` (not created here)."""
    env = os.environ.get("YOLOTRAIN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "yolotrain"
