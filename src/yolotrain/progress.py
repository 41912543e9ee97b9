"""Progress bars on stderr, one style for every command: training's batches, validation's batches,
prediction's and tracking's images and frames, export's formats and a dataset check's steps."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from tqdm import tqdm

# "1" shows every bar, in a terminal or not (a log, a test reading stderr); "0" hides every bar.
PROGRESS_ENV = "YOLOTRAIN_PROGRESS"
BAR_FORMAT = "{l_bar}{bar:10}{r_bar}"


def progress_bar(iterable: Iterable | None = None, *, total: float | None = None, desc: str = "", unit: str = "it",
                 enabled: bool = True, logged: bool = False, leave: bool = True) -> tqdm:
    """A tqdm bar on stderr in training's style, shown by the process that reports (``enabled``) when stderr is
    a terminal. Where it is not (a log, a pipe), only a ``logged`` bar is shown: training's, whose description
    is its record of each epoch's losses; the others would leave their states between the lines of a log that
    a script reads. ``YOLOTRAIN_PROGRESS=1`` shows every bar, ``YOLOTRAIN_PROGRESS=0`` none."""
    forced = os.environ.get(PROGRESS_ENV, "").strip()
    if forced in ("0", "1"):
        shown = enabled and forced == "1"
    else:
        shown = enabled and (logged or _stderr_is_a_terminal())
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, disable=not shown, file=sys.stderr,
                dynamic_ncols=True, bar_format=BAR_FORMAT)


def _stderr_is_a_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)  # a replaced stderr may not say
    return bool(isatty and isatty())
