"""The doctor on "element 0 of tensors does not require grad": the corpus in tests/doctor_cases/graph_cut/.

Each failing program marks the lines that cut the loss's ancestry off the graph (``# doctor: cut``)
and the backward that failed (``# doctor: failed``). The doctor runs as a real subprocess; its
patches are then applied to a copy of the program, which must run to the end with nothing
reported. ``clean_*`` programs must report nothing.
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
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
FOLDER = "tests/doctor_cases/graph_cut"
CASES = ROOT / FOLDER
MARK = re.compile(r"#\s*doctor:\s*(cut|failed)\s*$")
FAILING = sorted(p.name for p in CASES.glob("[a-z]*.py") if not p.name.startswith("clean_"))
CLEAN = sorted(p.name for p in CASES.glob("clean_*.py"))
KEYS = {"schema", "kind", "error", "sites", "fix", "patches", "severity", "notes"}
PYTORCH_ERROR = "element 0 of tensors does not require grad and does not have a grad_fn"


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), str(Path(inplace_doctor.__file__).parents[1])])
    return dict(os.environ, PYTHONPATH=path, PYTHONWARNINGS="ignore")


def _doctor(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "inplace_doctor", *args]
    return subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def _marks(path: Path) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {"cut": set(), "failed": set()}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = MARK.search(line)
        if match:
            found[match.group(1)].add(number)
    return found


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


def test_corpus_size() -> None:
    assert len(FAILING) >= 8 and len(CLEAN) >= 2


@pytest.mark.parametrize("name", FAILING)
def test_report_names_the_cutting_lines(name: str, runs: dict) -> None:
    proc, report, _ = runs[name]
    assert proc.returncode == 1, proc.stderr
    assert report is not None, proc.stdout
    assert set(report) == KEYS
    assert (report["schema"], report["kind"], report["severity"]) == (2, "graph_cut", "error")
    assert PYTORCH_ERROR in report["error"]
    marks = _marks(CASES / name)
    assert {s["line"] for s in report["sites"] if s["role"] == "cut at"} == marks["cut"]
    assert [s["line"] for s in report["sites"] if s["role"] == "failed at"] == sorted(marks["failed"])
    assert all(s["file"] == f"{FOLDER}/{name}" for s in report["sites"])


@pytest.mark.parametrize("name", FAILING)
def test_applied_fix_runs_clean(name: str, runs: dict) -> None:
    _, report, patched = runs[name]
    assert {p["line"] for p in report["patches"]} == _marks(CASES / name)["cut"], report["fix"]
    assert all(f"`{p['code']}`" in report["fix"] for p in report["patches"])
    assert (patched.returncode, patched.stdout, patched.stderr) == (0, "", "")


@pytest.mark.parametrize("name", CLEAN)
def test_clean_programs_report_nothing(name: str) -> None:
    proc = _doctor(f"{FOLDER}/{name}")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_watch_raises_pytorch_error_with_the_report() -> None:
    model = nn.Linear(3, 1)
    x = torch.randn(4, 3)
    with pytest.raises(inplace_doctor.GraphCutError) as info, inplace_doctor.watch():
        out = model(x).detach()
        (out**2).mean().backward()
    assert str(info.value) == PYTORCH_ERROR
    (report,) = info.value.reports
    assert [(role, site.op, site.code) for role, site in report.sites] == [
        ("cut at", ".detach()", "out = model(x).detach()"),
        ("failed at", "backward()", "(out**2).mean().backward()"),
    ]
    assert [p.code for p in report.patches] == ["out = model(x)"]


def test_frozen_parameters_and_integer_results_are_named_without_a_patch() -> None:
    model, classifier = nn.Linear(3, 1), nn.Linear(3, 4)
    opt = torch.optim.SGD([*model.parameters(), *classifier.parameters()], lr=0.1)
    model.requires_grad_(False)
    x, y = torch.randn(4, 3), torch.randn(4)
    with pytest.raises(inplace_doctor.GraphCutError) as info, inplace_doctor.watch():
        prediction = model(x).squeeze(1)
        labels = classifier(x).argmax(1).float()
        loss = (prediction - y).pow(2).mean() + (labels - y).abs().mean()
        loss.backward()
    (report,) = info.value.reports
    cuts = [(site.op, site.code) for role, site in report.sites if role == "cut at"]
    assert cuts == [
        ("frozen module", "prediction = model(x).squeeze(1)"),
        ("integer result", "labels = classifier(x).argmax(1).float()"),
    ]
    assert report.patches == [] and "requires_grad=False" in report.fix and "integer" in report.fix
    assert opt.param_groups


def test_nothing_requiring_grad_anywhere_is_left_to_pytorch() -> None:
    with pytest.raises(RuntimeError) as info, inplace_doctor.watch():
        data = torch.randn(3)
        data.sum().backward()
    assert type(info.value) is RuntimeError


def test_ipython_cell_magic_reports_a_graph_cut() -> None:
    pytest.importorskip("IPython", reason="IPython not installed (pip install 'inplace-doctor[ipython]')")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "inplace_doctor")
        shell.user_ns["torch"] = torch
        cell = "w = torch.ones(3, requires_grad=True)\nwith torch.no_grad():\n    y = w * 2\ny.sum().backward()\n"
        stream = io.StringIO()
        with redirect_stderr(stream), pytest.raises(inplace_doctor.GraphCutError) as info:
            shell.run_cell_magic("doctor", "", cell)
        (report,) = info.value.reports
        assert [(role, site.line) for role, site in report.sites] == [("cut at", 3), ("failed at", 4)]
        assert [p.code for p in report.patches] == ["with torch.enable_grad(): y = w * 2"]
        assert "cut at:      torch.no_grad() at <doctor-cell-" in stream.getvalue()
    finally:
        InteractiveShell.clear_instance()


def test_pytest_plugin_attaches_the_graph_cut_report(tmp_path: Path) -> None:
    (tmp_path / "test_model.py").write_text(
        "import torch\n\n\ndef test_loss():\n    w = torch.ones(2, requires_grad=True)\n"
        "    loss = (w * 3).sum().item()\n    torch.tensor(loss).backward()\n"
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--inplace-doctor", "test_model.py"]
    proc = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout
    assert "cut at:      round trip at test_model.py:6" in proc.stdout
    assert "loss = (w * 3).sum()" in proc.stdout
