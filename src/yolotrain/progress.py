"""Progress bars on stderr, one style for every command: training's batches, validation's batches,
prediction's and tracking's images and frames, export's formats and a dataset check's steps."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from tqdm import tqdm

# "0" hides every bar (scripts whose stderr is kept); anything else, or unset, shows them.
PROGRESS_ENV = "YOLOTRAIN_PROGRESS"
BAR_FORMAT = "{l_bar}{bar:10}{r_bar}"


def progress_bar(iterable: Iterable | None = None, *, total: float | None = None, desc: str = "", unit: str = "it",
                 enabled: bool = True, leave: bool = True) -> tqdm:
    """A tqdm bar on stderr in training's style, shown by the process that reports (``enabled``), in a
    terminal or not (a log then keeps the last state of each bar), unless ``YOLOTRAIN_PROGRESS=0``."""
    shown = enabled and os.environ.get(PROGRESS_ENV, "1").strip() != "0"
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, disable=not shown, file=sys.stderr,
                dynamic_ncols=True, bar_format=BAR_FORMAT)
