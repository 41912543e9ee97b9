"""``--verify-fix``: run a copy of the program with each report's patch applied, and keep only patches that ran.

A patch the doctor proposes is read from the program's source; whether it fixes the program is only
known by running it. Each report's patches are applied to a copy of the script (and of the ``.py``
files beside it when a patch changes one of them) in a temporary folder, and the copy runs under the
doctor in a fresh interpreter, in the user's working directory so relative data paths still resolve.
The child writes what it saw (backward passes completed, reports made) to the file named by
``VERIFY_RESULT_ENV``; the user's own files are only read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .report import GraphReport, Patch, Report, Verification, apply_patches

VERIFY_RESULT_ENV = "INPLACE_DOCTOR_VERIFY_RESULT"
NOT_VERIFIED = "no patch was verified"
MAX_SIBLINGS = 200  # .py files copied from the script's folder when a patch changes one of them
MAX_SIBLING_BYTES = 1 << 20  # larger files are not program sources worth copying
_OUTPUT_SHOWN = 400  # characters of the child's last error shown in the reason


@dataclass(frozen=True)
class ChildRun:
    """The patched program's run: exit code, completed backward passes, reports, and its last error."""

    exit_code: int | None  # None when the timeout stopped it
    steps: int
    reports: int
    last_error: str


def write_child_result(backward_passes: int, reports: int) -> None:
    """In a child the parent started, write what it saw to the file ``VERIFY_RESULT_ENV`` names."""
    path = os.environ.get(VERIFY_RESULT_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"backward_passes": backward_passes, "reports": reports}, handle)


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _copy_program(script: str, patches: Sequence[Patch], cwd: str, into: str) -> str:
    """Copy the script (and its folder's ``.py`` files if a patch needs one) into ``into``, patched.

    Returns the copied script's path; raises ``ValueError`` with the reason when a patch changes a
    file that is not the script or a ``.py`` file directly beside it.
    """
    script = os.path.abspath(script)
    folder = os.path.dirname(script)
    targets = {}
    for patch in patches:
        path = os.path.normpath(os.path.join(cwd, patch.file))
        if path != script and (os.path.dirname(path) != folder or not path.endswith(".py")):
            raise ValueError(f"the patch changes {patch.file}, which is not the script or a .py file beside it")
        targets.setdefault(path, []).append(patch)
    sources = [script]
    if set(targets) - {script}:
        siblings = sorted(entry.path for entry in os.scandir(folder)
                          if entry.name.endswith(".py") and entry.is_file() and entry.path != script
                          and entry.stat().st_size <= MAX_SIBLING_BYTES)
        sources += siblings[:MAX_SIBLINGS]
    for source in sources:
        copy = os.path.join(into, os.path.basename(source))
        if source in targets:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
            text = apply_patches(text, targets[source])
            with open(copy, "w", encoding="utf-8") as handle:
                handle.write(text)
        else:
            shutil.copyfile(source, copy)
    return os.path.join(into, os.path.basename(script))


def _child_environment(script: str, result_file: str) -> dict[str, str]:
    """The parent's environment, with the doctor and the script's folder importable and no bytecode written.

    The script's original folder follows the copy's on ``sys.path``, so modules beside the script that
    were not copied still import; ``PYTHONDONTWRITEBYTECODE`` keeps ``__pycache__`` out of the user's folder.
    """
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [package_root, os.path.dirname(os.path.abspath(script))]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONDONTWRITEBYTECODE": "1",
            VERIFY_RESULT_ENV: result_file}


def _last_error(stderr: str) -> str:
    """The line that says how the patched program failed: the doctor's report line, else the last line."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    reported = next((line for line in lines if line.startswith(("doctor error:", "doctor warning:"))), None)
    text = reported or (lines[-1] if lines else "")
    return text if len(text) <= _OUTPUT_SHOWN else text[:_OUTPUT_SHOWN] + "..."


def run_patched(script: str, args: Sequence[str], doctor_options: Sequence[str], patches: Sequence[Patch],
                timeout: float) -> ChildRun:
    """Run a patched copy of ``script`` under the doctor in a fresh interpreter, in the current directory."""
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="doctor-verify-") as folder:
        program = os.path.join(folder, "program")
        os.mkdir(program)
        copy = _copy_program(script, patches, cwd, program)
        result_file = os.path.join(folder, "result.json")
        # The copy's own reports are not verified again: the parent only needs to know whether it ran clean.
        command = [sys.executable, "-m", "inplace_doctor", "--no-verify-fix", *doctor_options, copy, *args]
        try:
            proc = subprocess.run(command, cwd=cwd, env=_child_environment(script, result_file),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return ChildRun(None, 0, 0, "")
        seen = {"backward_passes": 0, "reports": 0}
        if os.path.exists(result_file):
            with open(result_file, encoding="utf-8") as handle:
                seen = json.load(handle)
        return ChildRun(proc.returncode, seen["backward_passes"], seen["reports"], _last_error(proc.stderr))


def _describe(patches: Sequence[Patch]) -> str:
    return ", ".join(patch.summary() for patch in patches)


def _run_outcome(script: str, args: Sequence[str], doctor_options: Sequence[str], tried: Sequence[Patch],
                 timeout: float) -> tuple[int, str | None]:
    """The steps the patched copy ran, and why it did not run clean (None when it did)."""
    try:
        run = run_patched(script, args, doctor_options, tried, timeout)
    except ValueError as error:
        return 0, str(error)
    if run.exit_code == 0 and run.reports == 0:
        return run.steps, None
    if run.exit_code is None:
        return 0, f"the patched program timed out after {timeout:g} s"
    failure = f": {run.last_error}" if run.last_error else ""
    return 0, f"the patched program still failed (exit code {run.exit_code}){failure}"


def verify(report: Report | GraphReport, script: str, args: Sequence[str], doctor_options: Sequence[str],
           timeout: float) -> Report | GraphReport:
    """``report`` with its patches run: kept with a ``verified`` sentence, or dropped with the reason.

    The report's own patches are run first; when they do not run clean (or there are none), each of its
    ``candidates`` is run alone in turn, and the first that runs clean becomes the report's patch, which
    the fix then names (the fix as read from the source could not).
    """
    attempts = ([tuple(report.patches)] if report.patches else []) + [(patch,) for patch in report.candidates]
    reasons = []
    for tried in attempts:
        steps, reason = _run_outcome(script, args, doctor_options, tried, timeout)
        if reason is None:
            detail = f"verified: the patched program ran {steps} steps without the error"
            verified = "" if list(tried) == report.patches else f"; a run verified the change {_describe(tried)}"
            return replace(report, fix=report.fix + verified, patches=list(tried), candidates=[],
                           verification=Verification(True, detail, steps, tried))
        reasons.append(f"with {_describe(tried)}, {reason}")
    detail = f"{NOT_VERIFIED}: " + "; ".join(reasons)
    tried_all = tuple(patch for tried in attempts for patch in tried)
    return replace(report, patches=[], candidates=[], verification=Verification(False, detail, 0, tried_all))


def verify_reports(reports: Sequence[Report | GraphReport], script: str, args: Sequence[str],
                   doctor_options: Sequence[str], timeout: float) -> list[Report | GraphReport]:
    """Each report that proposes patches or candidates, verified by running them (see :func:`verify`)."""
    return [verify(report, script, args, doctor_options, timeout) if report.patches or report.candidates else report
            for report in reports]
