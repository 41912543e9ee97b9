"""Run folders: ``runs/train/exp``, then ``exp2``, ``exp3`` ..."""

from __future__ import annotations

import os
from pathlib import Path


def next_run_dir(project: str | os.PathLike, name: str = "exp", exist_ok: bool = False) -> Path:
    """``project/name``, or the first free ``project/nameN`` (N = 2, 3 ...) unless ``exist_ok``.

    The folder is not created here.
    """
    base = Path(project) / name
    if exist_ok or not base.exists():
        return base
    n = 2
    while (candidate := base.with_name(f"{name}{n}")).exists():
        n += 1
    return candidate
