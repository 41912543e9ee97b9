"""The ``%%doctor`` cell magic for IPython and Jupyter (``%load_ext inplace_doctor``).

The cell runs under :func:`watch` in the notebook's namespace; when backward fails on a
modified saved tensor, the report is printed (lines are the cell's own) and the error raised.
``%%doctor --check`` also reports modifications that did not raise. ``%%doctor --nan`` runs the
cell under ``watch(nan=True)``: the first NaN stops it with the report of the op that made it. The
two combine (``%%doctor --check --nan``).
"""

from __future__ import annotations

import itertools
import linecache
import os
import sys
from typing import Any

from .api import watch
from .messages import DoctorError
from .report import format_reports

_CELLS = itertools.count(1)
_OPTIONS = ("--check", "--nan")


def register(ipython: Any) -> None:
    """Add ``%%doctor`` to an IPython shell."""

    def doctor(line: str, cell: str) -> None:
        """Run the cell under the doctor; ``--check``: also report modifications that did not raise;
        ``--nan``: stop at the first NaN and report the op that made it."""
        options = line.split()
        unknown = [option for option in options if option not in _OPTIONS]
        if unknown:
            print(f"%%doctor: unknown option {unknown[0]!r} (options: {', '.join(_OPTIONS)})", file=sys.stderr)
            return
        check = "--check" in options
        name = f"<doctor-cell-{next(_CELLS)}>"
        # Registered like IPython's own cells, so reports and tracebacks can show the source lines.
        linecache.cache[name] = (len(cell), None, cell.splitlines(keepends=True), name)
        code = compile(cell, name, "exec")
        try:
            with watch(os.getcwd(), nan="--nan" in options) as tracker:
                exec(code, ipython.user_ns)
                found = tracker.reports() if check else []
        except DoctorError as error:
            print(format_reports(error.reports), file=sys.stderr)
            raise
        if found:
            print(format_reports(found), file=sys.stderr)

    ipython.register_magic_function(doctor, magic_kind="cell", magic_name="doctor")
