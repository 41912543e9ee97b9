"""The public entry points: ``watch()``, ``check_step()`` and ``run_with_report()``."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar

from .messages import DoctorError, InplaceWarning
from .mode import Tracker
from .nan_origin import NanWatch
from .report import Report, format_reports
from .silent_cut import SilentCuts
from .view_write import explain_write, write_error_kind

T = TypeVar("T")


_ACTIVE = threading.local()


def active_tracker() -> Tracker | None:
    """The tracker installed by an enclosing :func:`watch` on this thread, if any."""
    return getattr(_ACTIVE, "tracker", None)


class watch:  # noqa: N801 - used as a context manager, named like one
    """Track in-place modifications of saved tensors for the code in the ``with`` block.

    When backward fails because a saved tensor was modified, the ``RuntimeError`` PyTorch
    would raise is raised unchanged in type and message, with ``.reports`` and a note holding
    the diagnosis. The tracker is returned by ``__enter__``; its :meth:`Tracker.reports`
    lists modifications that did not (or not yet) raise. Nested ``watch()`` blocks share
    the outermost tracker. A parameter the optimizer updates whose module ran but which got no
    gradient is reported once as a :class:`SilentCutWarning` (and in ``tracker.silent_cuts.reports``);
    ``ignore_unused`` names (``fnmatch`` patterns) silence parameters left out on purpose.
    With ``nan=True`` the first non-finite value stops the block with
    a :class:`NanOriginError` naming the operator (or backward node) that made it.
    """

    def __init__(self, cwd: str | None = None, nan: bool = False, ignore_unused: Iterable[str] = (),
                 warn_unused: bool = True) -> None:
        self._cwd = cwd or os.getcwd()
        self._tracker: Tracker | None = None
        self._owner = False
        self._nan = NanWatch(self._cwd) if nan else None
        self._silent_cuts = SilentCuts(self._cwd, ignore_unused, warn_unused)

    def __enter__(self) -> Tracker:
        if self._nan is not None:
            self._nan.__enter__()
        current = active_tracker()
        if current is not None:
            self._tracker = current
            return current
        self._tracker = Tracker(self._cwd)
        self._tracker.__enter__()
        self._tracker.silent_cuts = self._silent_cuts
        self._silent_cuts.start()
        self._owner = True
        _ACTIVE.tracker = self._tracker
        return self._tracker

    def __exit__(self, kind: object, error: BaseException | None, traceback: TracebackType | None) -> None:
        if self._nan is not None:
            self._nan.active = False
            self._nan.__exit__(kind, error, traceback)
        if not self._owner or self._tracker is None:
            return
        _ACTIVE.tracker = None
        self._owner = False
        self._silent_cuts.stop()
        self._tracker.__exit__(kind, error, traceback)
        if error is not None and write_error_kind(error) is not None:
            # A refused leaf or view write raises in forward; its traceback holds all the diagnosis needs.
            explained = explain_write(error, traceback, self._cwd)
            if explained.reports:
                raise explained.with_traceback(traceback) from None


def check_step(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Report]:
    """Run ``fn(*args, **kwargs)`` once and report saved tensors modified in place.

    Finds modifications even when they do not raise (the backward that needs the tensor
    never runs, or runs later). Each report is also issued as an :class:`InplaceWarning`.
    Returns an empty list for clean code; a failing backward still raises.
    """
    with watch() as tracker:
        start = len(tracker.findings)
        fn(*args, **kwargs)
        reports = tracker.reports(start)
    for report in reports:
        warnings.warn(report.format(), InplaceWarning, stacklevel=2)
    return reports


def run_with_report(fn: Callable[..., T], *args: Any, file: Any = None, **kwargs: Any) -> T:
    """Run ``fn`` under :func:`watch`; if backward fails on a modified tensor, print the report.

    Meant for rerunning a training step that already failed without the doctor: the error
    is re-raised after the report is written to ``file`` (default ``sys.stderr``).
    """
    try:
        with watch():
            return fn(*args, **kwargs)
    except DoctorError as error:
        print(format_reports(error.reports), file=file or sys.stderr)
        raise
