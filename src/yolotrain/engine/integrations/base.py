"""What every experiment tracker of ``--logger`` shares: the error of one that cannot start, its package
imported only when asked for, the reference's tags for the ``results.csv`` columns, and the files it logs."""

from __future__ import annotations

import importlib
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...task import get_task, task_names

# The learning rates' columns → the reference's TensorBoard tags (the others are the tasks': Task.logger_tags).
LR_TAGS = {"lr0": "x/lr0", "lr1": "x/lr1", "lr2": "x/lr2"}
# results.csv column → the reference's TensorBoard tag, for every registered task's columns (a column means the
# same in every task that has it, so one mapping serves all runs).
TAGS = {**{column: tag for name in task_names() for column, tag in get_task(name).logger_tags.items()}, **LR_TAGS}
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class LoggerError(RuntimeError):
    """A logger asked for with ``--logger`` cannot start; the message says why and what to do."""


def import_package(module: str, logger: str) -> Any:
    """``module``, which ``--logger logger`` needs.

    Raises:
        LoggerError: it is not installed (the message names the extra that installs it).
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise LoggerError(f"--logger {logger} needs the {module} package: pip install 'yolotrain[{logger}]'") \
            from None


def error_line(error: BaseException) -> str:
    """``error`` as one line: its type and its message's first line of words (some trackers' messages are
    banners over several lines, in terminal colours)."""
    lines = (line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(error)).splitlines())
    words = next((line for line in lines if re.search(r"[a-z]", line) and not line.startswith("--")), "")
    return f"{type(error).__name__}: {words}" if words else type(error).__name__


def flat_settings(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested configuration as ``{"data.img_size": 640, ...}`` (MLflow parameters are flat)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def tagged(values: Mapping[str, float]) -> dict[str, float]:
    """A ``results.csv`` row's values under the reference's tags (``train/box_loss``, ``x/lr0`` …)."""
    return {TAGS.get(column, column): value for column, value in values.items()}


def best_weights(weights: Path) -> list[Path]:
    """The files of the best weights (``best.safetensors`` and ``best.json``), or none when either is missing."""
    files = [weights / f"best{suffix}" for suffix in (".safetensors", ".json")]
    return files if all(f.is_file() for f in files) else []


def image_files(folder: Path) -> list[Path]:
    """The images in ``folder`` (the drawn validation predictions), by name."""
    return sorted(p for p in Path(folder).glob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


def new_run_key() -> str:
    """A key for a tracker's run that the run folder keeps, so that a resumed run finds the same one (32
    hexadecimal digits: Comet's experiment keys take 32 to 50 letters or digits, Neptune's custom run ids 36)."""
    return uuid.uuid4().hex
