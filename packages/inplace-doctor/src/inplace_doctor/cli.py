"""``inplace-doctor``: run a script and explain in-place, freed-graph, leaf and view errors, or lint sources."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .lint import lint_paths
from .report import format_reports, reports_to_json
from .runner import run_script
from .verify_fix import verify_reports, write_child_result

# A patched copy may run this many times as long as the program's own run before it is stopped.
VERIFY_TIMEOUT_FACTOR = 5.0
MIN_VERIFY_TIMEOUT_S = 60.0
# Without --verify-fix or --no-verify-fix, patches are run when the program's own run ended this quickly:
# a second run then costs the user little. The environment variable sets another limit (0 turns it off).
AUTO_VERIFY_ENV = "INPLACE_DOCTOR_AUTO_VERIFY_S"
AUTO_VERIFY_MAX_S = 20.0


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Run SCRIPT like `python SCRIPT ARGS` and, if backward fails because a tensor saved for "
            "backward was modified in place, report which operation saved it and which modified it; "
            "if it fails on a graph already freed, report the backward that freed it and the line that "
            "carried it into the new graph; if an in-place write into a leaf or a view is refused, report the "
            "line that made the leaf or view; if backward gets a loss without graph, report the lines that cut it. "
            "With --nan, stop at the first non-finite value and report the operation that made it."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument(
        "--check",
        action="store_true",
        help="also report modifications of saved tensors that did not raise (exit 1 if any)",
    )
    parser.add_argument(
        "--nan",
        action="store_true",
        help="stop at the first operation (forward op or backward node) whose result is NaN or inf, and name it",
    )
    parser.add_argument(
        "--ignore-unused",
        action="append",
        default=[],
        metavar="NAME",
        help="do not report this parameter (an fnmatch pattern of its dotted name) when it gets no gradient; "
        "repeatable",
    )
    verify = parser.add_mutually_exclusive_group()
    verify.add_argument(
        "--verify-fix",
        action="store_true",
        default=None,
        help="apply each proposed single-line patch to a copy of the program in a temporary folder, run the copy "
        "under the doctor, and propose only patches that ran clean (the user's files are not changed); by default "
        f"done when the program's run ended within {AUTO_VERIFY_MAX_S:g} s (${AUTO_VERIFY_ENV} sets the limit, "
        "0 turns it off)",
    )
    verify.add_argument(
        "--no-verify-fix",
        dest="verify_fix",
        action="store_false",
        help="never run the proposed patches; propose them as read from the source",
    )
    parser.add_argument(
        "--verify-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"stop a patched copy after this long (default: {VERIFY_TIMEOUT_FACTOR:g} times the program's "
        f"own run, at least {MIN_VERIFY_TIMEOUT_S:g} s)",
    )
    parser.add_argument("--lint", action="store_true", help="statically scan the given files/folders instead")
    parser.add_argument("target", metavar="SCRIPT|PATH", help="script to run, or path to lint with --lint")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return parser


def _lint(paths: list[str], as_json: bool) -> int:
    findings = lint_paths(paths)
    if as_json:
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        for finding in findings:
            print(finding.format())
        if findings:
            print(f"{len(findings)} in-place hazard(s) found", file=sys.stderr)
    return 1 if findings else 0


def _doctor_options(options: argparse.Namespace) -> list[str]:
    """The options that change what the doctor reports, to run a patched copy as the program was run."""
    flags = [flag for flag, on in (("--check", options.check), ("--nan", options.nan)) if on]
    return flags + [f"--ignore-unused={name}" for name in options.ignore_unused]


def auto_verify_limit() -> float:
    """Seconds within which the program's run must end for its patches to be run without ``--verify-fix``."""
    value = os.environ.get(AUTO_VERIFY_ENV, "").strip()
    try:
        return float(value) if value else AUTO_VERIFY_MAX_S
    except ValueError:
        raise SystemExit(f"{AUTO_VERIFY_ENV} must be a number of seconds, not {value!r}") from None


def _verifies(requested: bool | None, elapsed: float) -> bool:
    """``--verify-fix`` (True) or ``--no-verify-fix`` (False) as asked; by default when the run was short."""
    return requested if requested is not None else elapsed <= auto_verify_limit()


def main(argv: list[str], prog: str = "inplace-doctor") -> int:
    """``inplace-doctor ARGS...`` (also ``python -m inplace_doctor``); returns the process exit code."""
    options = _parser(prog).parse_args(argv)
    if options.lint:
        return _lint([options.target, *options.args], options.json)
    sys.stdout.flush()
    started = time.monotonic()
    result = run_script(options.target, options.args, check=options.check, nan=options.nan,
                        ignore_unused=options.ignore_unused)
    reports = result.errors + result.warnings
    write_child_result(result.backward_passes, len(reports))
    elapsed = time.monotonic() - started
    if _verifies(options.verify_fix, elapsed) and any(report.patches or report.candidates for report in reports):
        timeout = options.verify_timeout or max(MIN_VERIFY_TIMEOUT_S, VERIFY_TIMEOUT_FACTOR * elapsed)
        reports = verify_reports(reports, options.target, options.args, _doctor_options(options), timeout)
    if reports:
        sys.stdout.flush()
        if options.json:
            print(reports_to_json(reports))
        else:
            print(format_reports(reports), file=sys.stderr)
    if result.warnings and result.exit_code == 0:
        return 1
    return result.exit_code


def run() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv[1:]))
