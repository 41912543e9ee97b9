"""What the doctor corpus tests (tests/test_doctor_*.py) share: the programs of one folder of
tests/doctor_cases/, the doctor run on them, each in a process of its own, their ``# doctor: ...`` marks, a
report's patches applied to a copy of a program that is then run again, and the checks every report
(or a clean program's silence) must pass; also the IPython cell magic and the pytest plugin run on a
snippet."""

from __future__ import annotations

import atexit
import io
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stderr
from pathlib import Path
from typing import NamedTuple

import inplace_doctor
import pytest
import torch
from inplace_doctor.report import Patch

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"schema", "kind", "error", "sites", "fix", "patches", "severity", "notes"}
# Per failing program: the doctor's process, its JSON report, and the doctor's run of the patched copy.
Run = tuple[subprocess.CompletedProcess[str], dict | None, subprocess.CompletedProcess[str] | None]


class Corpus(NamedTuple):
    """One folder of tests/doctor_cases/: its path from the checkout's root, its absolute path, and
    its failing and ``clean_*`` programs."""

    folder: str
    cases: Path
    failing: list[str]
    clean: list[str]


def corpus(kind: str) -> Corpus:
    folder = f"tests/doctor_cases/{kind}"
    cases = ROOT / folder
    failing = sorted(p.name for p in cases.glob("[a-z]*.py") if not p.name.startswith("clean_"))
    return Corpus(folder, cases, failing, sorted(p.name for p in cases.glob("clean_*.py")))


def doctor_env() -> dict[str, str]:
    """The environment of a subprocess that imports this checkout's yolotrain and inplace_doctor."""
    path = os.pathsep.join([str(ROOT / "src"), str(Path(inplace_doctor.__file__).parents[1])])
    return dict(os.environ, PYTHONPATH=path, PYTHONWARNINGS="ignore")


class _ForkServer:
    """A ``doctor_fork_server.py`` process: runs one command at a time in a child forked from it."""

    def __init__(self) -> None:
        command = [sys.executable, str(Path(__file__).with_name("doctor_fork_server.py"))]
        self.process = subprocess.Popen(command, env=doctor_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        self.output = Path(tempfile.mkdtemp(prefix="doctor-fork-"))

    def run(self, argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
        stdout, stderr = self.output / "stdout", self.output / "stderr"
        request = {"argv": argv, "cwd": str(cwd), "stdout": str(stdout), "stderr": str(stderr), "timeout": timeout}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, f"the fork server exited with code {self.process.wait()}"
        returncode = json.loads(answer)["returncode"]
        return subprocess.CompletedProcess(argv, returncode, stdout.read_text(), stderr.read_text())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()
        shutil.rmtree(self.output, ignore_errors=True)


_idle_servers: queue.SimpleQueue[_ForkServer] = queue.SimpleQueue()
_all_servers: list[_ForkServer] = []


def run_forked(*argv: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` (``-m MODULE ARGS`` or ``SCRIPT ARGS``) in ``cwd`` with ``doctor_env()``, run in a
    process forked from a server that has already imported torch and the doctor; one server per
    concurrent caller, all closed when the test session ends."""
    try:
        server = _idle_servers.get_nowait()
    except queue.Empty:
        server = _ForkServer()
        if not _all_servers:
            atexit.register(lambda: [s.close() for s in _all_servers])
        _all_servers.append(server)
    try:
        return server.run(list(argv), cwd, timeout)
    finally:
        _idle_servers.put(server)


def run_doctor(*args: str, cwd: Path = ROOT, module: str = "inplace_doctor") -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS``; ``inplace_doctor`` runs in a forked process (``run_forked``), another
    module as a fresh interpreter."""
    if module == "inplace_doctor":
        return run_forked("-m", module, *args, cwd=cwd)
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(command, cwd=cwd, env=doctor_env(), capture_output=True, text=True, timeout=300)


def marked_lines(path: Path, mark: re.Pattern[str]) -> Iterator[tuple[int, str]]:
    """(line number, the mark's first group) for every line of the program that ``mark`` matches."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = mark.search(line)
        if match:
            yield number, match.group(1)


def lines_by_role(path: Path, mark: re.Pattern[str], roles: Sequence[str]) -> dict[str, set[int]]:
    """Per role, the lines whose mark (one or more roles separated by spaces) names it."""
    found: dict[str, set[int]] = {role: set() for role in roles}
    for number, marked in marked_lines(path, mark):
        for role in marked.split():
            found[role].add(number)
    return found


def json_report(stdout: str) -> dict | None:
    start = stdout.find("{\n")
    return json.loads(stdout[start:]) if start >= 0 else None


def patched_lines(report: dict) -> tuple[str, ...]:
    """The code of the report's patches in line order, as a program's fixed version lists its changed lines."""
    return tuple(patch["code"] for patch in sorted(report["patches"], key=lambda patch: patch["line"]))


def patched_copy(folder: str, name: str, report: dict, target: Path) -> Path:
    """The program ``folder/name`` with the report's patches applied, written into ``target``."""
    source = (ROOT / folder / name).read_text()
    for patch in report["patches"]:
        assert patch["file"] == f"{folder}/{name}"
        source = Patch(name, patch["line"], patch["code"]).apply(source)
    copy = target / name
    copy.write_text(source)
    return copy


PROGRAM_OPTIONS = re.compile(r"^#\s*doctor-options:\s*(.+)$", re.MULTILINE)


def program_options(path: Path) -> tuple[str, ...]:
    """The doctor's options a program asks for in a ``# doctor-options: ...`` line (``--verify-fix`` where
    only a verified candidate fixes it: the tests' runs do not verify by default, ``tests/conftest.py``)."""
    found = PROGRAM_OPTIONS.search(path.read_text())
    return tuple(found.group(1).split()) if found else ()


def run_corpus(folder: str, names: Sequence[str], target: Path, *options: str) -> dict[str, Run]:
    """Per program: the doctor's ``--json`` run with ``options`` (and the program's own, ``program_options``),
    and its run of the patched copy (written into ``target``) when the report has patches; two programs at a
    time."""

    def run(name: str) -> Run:
        proc = run_doctor(*options, *program_options(ROOT / folder / name), "--json", f"{folder}/{name}")
        report = json_report(proc.stdout)
        patched = None
        if report and report["patches"]:
            patched_copy(folder, name, report, target)
            patched = run_doctor(*options, name, cwd=target)
        return proc, report, patched

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(run, names)))


def runs_fixture(cases: Corpus, *options: str) -> Callable[..., dict[str, Run]]:
    """The module-scoped ``runs`` fixture: ``run_corpus`` on the failing programs of ``cases``."""

    @pytest.fixture(scope="module", name="runs")
    def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
        return run_corpus(cases.folder, cases.failing, tmp_path_factory.mktemp("patched"), *options)

    return runs


def assert_reports_nothing(proc: subprocess.CompletedProcess[str]) -> None:
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def assert_error_report(proc: subprocess.CompletedProcess[str], report: dict | None, kind: str, program: str) -> None:
    """The doctor failed the run and its JSON report is a complete error report of ``kind``, every
    site of which lies in ``program``."""
    assert proc.returncode == 1, proc.stderr
    assert report is not None, proc.stdout
    assert set(report) in (KEYS, KEYS | {"verification"})  # the latter where the doctor ran its patches
    assert (report["schema"], report["kind"], report["severity"]) == (2, kind, "error")
    assert all(s["file"] == program for s in report["sites"])


def run_cell_magic(cell: str, error: type[Exception]) -> tuple[Exception, str]:
    """Run ``cell`` under the ``%%doctor`` IPython cell magic, which must raise ``error``: the error
    raised and what the magic wrote to stderr."""
    pytest.importorskip("IPython", reason="IPython not installed (pip install 'inplace-doctor[ipython]')")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "inplace_doctor")
        shell.user_ns["torch"] = torch
        stream = io.StringIO()
        with redirect_stderr(stream), pytest.raises(error) as info:
            shell.run_cell_magic("doctor", "", cell)
        return info.value, stream.getvalue()
    finally:
        InteractiveShell.clear_instance()


def run_pytest_plugin(folder: Path, test_source: str) -> subprocess.CompletedProcess[str]:
    """Run pytest with ``--inplace-doctor`` on ``test_source`` written as ``folder/test_model.py``."""
    (folder / "test_model.py").write_text(test_source)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--inplace-doctor", "test_model.py"]
    return subprocess.run(command, cwd=folder, env=doctor_env(), capture_output=True, text=True, timeout=300)
