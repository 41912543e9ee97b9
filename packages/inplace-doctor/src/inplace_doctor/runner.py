"""Run a Python script the way ``python SCRIPT ARGS`` would, under :func:`watch`."""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

from .api import watch
from .messages import DoctorError
from .report import GraphReport, Report
from .view_write import explain_write, write_error_kind


@dataclass
class RunResult:
    """Outcome of a watched script: its exit code and what the doctor found."""

    exit_code: int
    errors: list[Report | GraphReport] = field(default_factory=list)
    warnings: list[Report | GraphReport] = field(default_factory=list)
    backward_passes: int = 0  # the backward passes that completed under the doctor


def _exit_code(code: object) -> int:
    """``SystemExit.code`` mapped the way the interpreter maps it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _user_traceback(tb: TracebackType | None, script: str) -> TracebackType | None:
    """Skip the runner's own frames so the traceback starts in the script, as with ``python``."""
    target = os.path.abspath(script)
    current = tb
    while current is not None:
        if os.path.abspath(current.tb_frame.f_code.co_filename) == target:
            return current
        current = current.tb_next
    return tb


def _signature(report: Report) -> tuple:
    return report.saved_by, tuple(report.modified_by)


def run_script(script: str, args: list[str], check: bool = False, nan: bool = False,
               ignore_unused: Sequence[str] = ()) -> RunResult:
    """Execute ``script`` as ``__main__`` with ``sys.argv``/``sys.path[0]`` set like the interpreter.

    A backward failure the doctor explains (an in-place modification, a freed graph) becomes
    ``errors``; with ``check``, modifications that did not raise become ``warnings``. Other
    exceptions are printed as Python would print them and give exit code 1. With ``nan``, the
    first non-finite value stops the script with its origin as the error. Parameters the optimizer
    updates that got no gradient although their module ran are ``warnings`` too (``ignore_unused``
    names those left out on purpose).
    """
    try:
        with open(script, "rb") as handle:
            source = handle.read()
    except OSError as error:  # the interpreter's own one line and exit code
        print(f"{getattr(sys, 'orig_argv', [sys.executable])[0]}: can't open file {os.path.abspath(script)!r}: "
              f"[Errno {error.errno}] {error.strerror}", file=sys.stderr)
        return RunResult(2)
    try:
        compile(source, script, "exec")
    except (SyntaxError, ValueError) as error:  # shown as python shows it, without the doctor's frames
        traceback.print_exception(type(error), error, None)
        return RunResult(1)
    saved_argv, saved_path0 = sys.argv, sys.path[0]
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    result = RunResult(0)
    try:
        with watch(os.getcwd(), nan=nan, ignore_unused=ignore_unused, warn_unused=False) as tracker:
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as exit_request:
                result.exit_code = _exit_code(exit_request.code)
            except DoctorError as error:
                result.errors = list(error.reports)
                result.exit_code = 1
            except BaseException as error:  # noqa: BLE001 - mirror the interpreter for any failure
                explained = explain_write(error, error.__traceback__, os.getcwd()) if write_error_kind(error) else None
                if explained is not None and explained.reports:
                    result.errors = list(explained.reports)
                else:
                    traceback.print_exception(type(error), error, _user_traceback(error.__traceback__, script))
                result.exit_code = 1
            if check:
                seen = {_signature(r) for r in result.errors if isinstance(r, Report)}
                result.warnings = [r for r in tracker.reports() if _signature(r) not in seen]
            if tracker.silent_cuts is not None:
                result.warnings += tracker.silent_cuts.reports
            result.backward_passes = tracker.backward_passes
    finally:
        sys.argv, sys.path[0] = saved_argv, saved_path0
    return result
