"""Run folders: ``runs/train/exp``, then ``exp2``, ``exp3`` ..."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .messages import brief

# The longest file name Linux, macOS and Windows file systems accept (bytes); a run name leaves room
# for the number added when the name is taken.
FILE_NAME_MAX_BYTES = 255
MAX_NAME_BYTES = 200


def next_run_dir(project: str | os.PathLike, name: str = "exp", exist_ok: bool = False) -> Path:
    """``project/name``, or the first free ``project/nameN`` (N = 2, 3 ...) unless ``exist_ok``.

    The folder is not created here.

    Raises:
        ValueError: a folder name longer than file systems allow (checked before any file is touched).
    """
    for option, value in (("--project", os.fspath(project)), ("--name", name)):
        longest = max(Path(value).parts, key=lambda part: len(part.encode()), default="")
        limit = MAX_NAME_BYTES if option == "--name" else FILE_NAME_MAX_BYTES
        if len(longest.encode()) > limit:
            raise ValueError(f"{option}: the folder name {brief(longest)} is {len(longest.encode())} "
                             f"bytes long, more than the {limit} allowed")
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
