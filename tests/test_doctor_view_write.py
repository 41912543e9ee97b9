"""The doctor on in-place writes into leaves and views PyTorch refuses: the corpus in tests/doctor_cases/view_write/.

Each failing program marks the line that made the leaf or view (``# doctor: made``) and the write
(``# doctor: written``); ``# doctor-fix: no_grad|out_of_place|clone`` says which fix is right: the
write under ``torch.no_grad()``, the write out of place, or the view cloned where it is made. The doctor runs as
a real subprocess; its patches are then applied to a copy of the program, which must run to the end
with nothing reported. ``clean_*`` programs must report nothing.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stderr
from pathlib import Path

import inplace_doctor
import pytest
import torch
from inplace_doctor.report import Patch

ROOT = Path(__file__).resolve().parents[1]
FOLDER = "tests/doctor_cases/view_write"
CASES = ROOT / FOLDER
MARK = re.compile(r"#\s*doctor:\s*(made|written)\s*$")
FIX = re.compile(r"#\s*doctor-fix:\s*(no_grad|clone|out_of_place)")
FAILING = sorted(p.name for p in CASES.glob("[a-z]*.py") if not p.name.startswith("clean_"))
CLEAN = sorted(p.name for p in CASES.glob("clean_*.py"))
KEYS = {"schema", "kind", "error", "sites", "fix", "patches", "severity", "notes"}
KIND = {"no_grad": "leaf_write", "out_of_place": "view_write", "clone": "view_write"}
TOKEN = {"no_grad": "torch.no_grad()", "out_of_place": " = ", "clone": ".clone()"}


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), str(Path(inplace_doctor.__file__).parents[1])])
    return dict(os.environ, PYTHONPATH=path, PYTHONWARNINGS="ignore")


def _doctor(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "inplace_doctor", *args]
    return subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def _marks(path: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = MARK.search(line)
        if match:
            found[match.group(1)] = number
    return found


def _fix(name: str) -> str:
    return FIX.search((CASES / name).read_text()).group(1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """Per failing program: the doctor's JSON report and the doctor's run of the patched copy."""
    folder = tmp_path_factory.mktemp("patched")

    def run(name: str) -> tuple:
        proc = _doctor("--json", f"{FOLDER}/{name}")
        start = proc.stdout.find("{\n")
        report = json.loads(proc.stdout[start:]) if start >= 0 else None
        patched = None
        if report and report["patches"]:
            source = (CASES / name).read_text()
            for patch in report["patches"]:
                assert patch["file"] == f"{FOLDER}/{name}"
                source = Patch(name, patch["line"], patch["code"]).apply(source)
            (folder / name).write_text(source)
            patched = _doctor(name, cwd=folder)
        return proc, report, patched

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(FAILING, pool.map(run, FAILING)))


def test_corpus_covers_both_fixes() -> None:
    assert len(FAILING) >= 8 and len(CLEAN) >= 2
    assert {_fix(name) for name in FAILING} == {"no_grad", "out_of_place", "clone"}


@pytest.mark.parametrize("name", FAILING)
def test_report_names_the_making_line_and_the_write(name: str, runs: dict) -> None:
    proc, report, _ = runs[name]
    assert proc.returncode == 1, proc.stderr
    assert report is not None, proc.stdout
    assert set(report) == KEYS
    assert (report["schema"], report["kind"], report["severity"]) == (2, KIND[_fix(name)], "error")
    marks = _marks(CASES / name)
    expected = [("made by", marks["made"]), ("written by", marks["written"])]
    assert [(s["role"], s["line"]) for s in report["sites"]] == expected
    assert all(s["file"] == f"{FOLDER}/{name}" for s in report["sites"])


@pytest.mark.parametrize("name", FAILING)
def test_applied_fix_runs_clean(name: str, runs: dict) -> None:
    _, report, patched = runs[name]
    fix = _fix(name)
    marks = _marks(CASES / name)
    expected_line = marks["made"] if fix == "clone" else marks["written"]
    assert [p["line"] for p in report["patches"]] == [expected_line], report["fix"]
    code = report["patches"][0]["code"]
    assert TOKEN[fix] in code
    assert TOKEN[fix] in report["fix"] if fix == "no_grad" else f"`{code}`" in report["fix"]
    assert (patched.returncode, patched.stdout, patched.stderr) == (0, "", "")


@pytest.mark.parametrize("name", CLEAN)
def test_clean_programs_report_nothing(name: str) -> None:
    proc = _doctor(f"{FOLDER}/{name}")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_watch_raises_pytorch_error_with_the_report() -> None:
    with pytest.raises(RuntimeError) as plain:
        torch.zeros(2, requires_grad=True).add_(1)
    with pytest.raises(inplace_doctor.InplaceWriteError) as info, inplace_doctor.watch():
        bias = torch.zeros(2, requires_grad=True)
        bias.add_(1)
    assert str(info.value) == str(plain.value)
    (report,) = info.value.reports
    assert [(role, site.code) for role, site in report.sites] == [
        ("made by", "bias = torch.zeros(2, requires_grad=True)"),
        ("written by", "bias.add_(1)"),
    ]
    assert [p.code for p in report.patches] == ["with torch.no_grad(): bias.add_(1)"]


def test_view_made_in_a_loop_header_is_cloned_there() -> None:
    with pytest.raises(inplace_doctor.InplaceWriteError) as info, inplace_doctor.watch():
        h = torch.randn(4, 3, requires_grad=True) * 2
        for part in h.split(2):
            part[0] = 0
    (report,) = info.value.reports
    assert [p.code for p in report.patches] == ["for part in [part.clone() for part in h.split(2)]:"]


def test_ipython_cell_magic_reports_a_view_write() -> None:
    pytest.importorskip("IPython", reason="IPython not installed (pip install 'inplace-doctor[ipython]')")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "inplace_doctor")
        shell.user_ns["torch"] = torch
        cell = "h = torch.randn(4, 2, requires_grad=True) * 2\na, b = h.unbind(1)\na.mul_(2)\n"
        stream = io.StringIO()
        with redirect_stderr(stream), pytest.raises(inplace_doctor.InplaceWriteError) as info:
            shell.run_cell_magic("doctor", "", cell)
        (report,) = info.value.reports
        assert [(role, site.line) for role, site in report.sites] == [("made by", 2), ("written by", 3)]
        assert [p.code for p in report.patches] == ["a = a.mul(2)"]
        assert "made by:     unbind at <doctor-cell-" in stream.getvalue()
    finally:
        InteractiveShell.clear_instance()


def test_pytest_plugin_attaches_the_view_write_report(tmp_path: Path) -> None:
    (tmp_path / "test_model.py").write_text(
        "import torch\n\n\ndef test_init():\n    w = torch.empty(3, requires_grad=True)\n    w.normal_()\n"
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--inplace-doctor", "test_model.py"]
    proc = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout
    assert "made by:     torch.empty at test_model.py:5" in proc.stdout
    assert "with torch.no_grad(): w.normal_()" in proc.stdout
