"""Run folders: ``runs/train/exp``, then ``exp2``, ``exp3`` ..."""

from __future__ import annotations

import argparse
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


def add_run_dir_arguments(parser: argparse.ArgumentParser, project: str) -> None:
    """``--project``, ``--name`` and ``--exist-ok``: where a command writes its run folder."""
    parser.add_argument("--project", default=project, help=f"parent of the run folder (default {project})")
    parser.add_argument("--name", default="exp", help="run folder name (exp, exp2 ... when taken)")
    parser.add_argument("--exist-ok", action="store_true", help="reuse an existing run folder")
