"""The ways in: `python -m inplace_doctor`, the `inplace-doctor` script, `pytest --inplace-doctor`, `%%doctor`."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import inplace_doctor
import pytest

PACKAGE_PATH = str(Path(inplace_doctor.__file__).parents[1])

FAILING = textwrap.dedent(
    """
    import torch

    x = torch.randn(3, requires_grad=True)
    y = x.sigmoid()
    y.mul_(2)
    y.sum().backward()
    """
).lstrip()


CARRIED_STATE = textwrap.dedent(
    """
    w = torch.randn(3, 3, requires_grad=True)
    h = torch.zeros(2, 3)
    for step in range(2):
        h = torch.tanh(h @ w)
        h.sum().backward()
    """
).lstrip()

# A row of zeros divided by its own sum: 0/0 in forward.
NAN_SHARE = textwrap.dedent(
    """
    scores = torch.tensor([[0.0, 3.0], [0.0, 0.0]], requires_grad=True)
    share = scores / scores.sum(1, keepdim=True)
    share.mean().backward()
    """
).lstrip()
NAN_SHARE_FIXED = NAN_SHARE.replace("keepdim=True)", "keepdim=True).clamp_min(1e-12)")


def _env() -> dict[str, str]:
    """The doctor under test, importable in a subprocess whether installed or not."""
    paths = [PACKAGE_PATH, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONWARNINGS="ignore")


def test_module_and_console_script_report_both_lines(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(FAILING)
    commands = [[sys.executable, "-m", "inplace_doctor", "train.py"]]
    console = Path(sys.executable).parent / "inplace-doctor"
    if console.exists():  # installed (pip install ./packages/inplace-doctor); absent when run from a checkout path
        commands.append([str(console), "train.py"])
    for command in commands:
        proc = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr
        assert "saved by:    aten::sigmoid at train.py:4" in proc.stderr
        assert "modified by: aten::mul_ at train.py:5" in proc.stderr
    help_text = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "--help"], env=_env(), capture_output=True, text=True, timeout=120
    ).stdout
    assert help_text.startswith("usage: inplace-doctor")


def test_a_missing_or_broken_script_fails_as_python_would(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("x = (\n")
    for script, code in (("missing.py", 2), ("broken.py", 1)):
        doctor = subprocess.run([sys.executable, "-m", "inplace_doctor", script], cwd=tmp_path, env=_env(),
                                capture_output=True, text=True, timeout=120)
        python = subprocess.run([sys.executable, script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert doctor.returncode == python.returncode == code
        assert "inplace_doctor" not in doctor.stderr and "Traceback" not in doctor.stderr
        assert doctor.stderr.strip().splitlines()[-1] == python.stderr.strip().splitlines()[-1]


def _pytest(
    tmp_path: Path, *options: str, failing: str = FAILING, clean: str = "assert True\n"
) -> subprocess.CompletedProcess[str]:
    tests = {"test_step": failing, "test_clean": clean}
    (tmp_path / "test_model.py").write_text(
        "\n\n".join(f"def {name}():\n" + textwrap.indent(body, "    ") for name, body in tests.items())
    )
    # The plugin is named explicitly, and its entry point blocked, so the run is the same installed or not.
    command = [sys.executable, "-m", "pytest", "-p", "no:inplace_doctor", "-p", "inplace_doctor.pytest_plugin"]
    command += ["-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path), *options, "test_model.py"]
    return subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)


def test_pytest_plugin_attaches_the_report_to_the_failure(tmp_path: Path) -> None:
    proc = _pytest(tmp_path, "--inplace-doctor")
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed" in proc.stdout
    assert "inplace doctor" in proc.stdout
    assert "saved by:    aten::sigmoid at test_model.py:5" in proc.stdout
    assert "modified by: aten::mul_ at test_model.py:6" in proc.stdout
    plain = _pytest(tmp_path)
    assert "1 failed, 1 passed" in plain.stdout and "modified by:" not in plain.stdout


def test_pytest_plugin_attaches_the_graph_freed_report(tmp_path: Path) -> None:
    proc = _pytest(tmp_path, "--inplace-doctor", failing="import torch\n" + CARRIED_STATE)
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed" in proc.stdout
    assert "freed by:    backward() at test_model.py:7" in proc.stdout
    assert "carried by:  MmBackward0 at test_model.py:6" in proc.stdout
    assert "h = torch.tanh(h.detach() @ w)" in proc.stdout


def test_pytest_plugin_attaches_the_nan_origin_report(tmp_path: Path) -> None:
    # test_step divides by 0; test_clean runs the fixed line under the same checks and must pass.
    proc = _pytest(tmp_path, "--inplace-doctor-nan", failing="import torch\n" + NAN_SHARE,
                   clean="import torch\n" + NAN_SHARE_FIXED)
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed" in proc.stdout
    assert "FAILED test_model.py::test_step - inplace_doctor.nan_origin.NanOriginError" in proc.stdout
    assert "inplace doctor" in proc.stdout
    assert proc.stdout.count("forward op:  div at test_model.py:4") == 1
    assert "share = scores / scores.sum(1, keepdim=True).clamp_min(1e-12)" in proc.stdout


@pytest.fixture
def ipython_shell() -> Iterator[Any]:
    """An IPython shell with the doctor's extension loaded and ``torch`` in its namespace."""
    pytest.importorskip("IPython", reason="IPython not installed (pip install 'inplace-doctor[ipython]')")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "inplace_doctor")
        shell.user_ns["torch"] = __import__("torch")
        yield shell
    finally:
        InteractiveShell.clear_instance()


def _run_cell(shell: Any, options: str, cell: str) -> str:
    """Run ``cell`` under ``%%doctor OPTIONS`` and return what it printed to stderr."""
    stream = io.StringIO()
    with redirect_stderr(stream):
        shell.run_cell_magic("doctor", options, cell)
    return stream.getvalue()


def test_ipython_cell_magic_reports_lines_of_the_cell(ipython_shell: Any) -> None:
    stream = io.StringIO()
    with redirect_stderr(stream), pytest.raises(inplace_doctor.SavedTensorModifiedError) as info:
        ipython_shell.run_cell_magic("doctor", "", FAILING)
    (report,) = info.value.reports
    assert (report.saved_by.line, report.saved_by.code) == (4, "y = x.sigmoid()")
    assert [(site.line, site.code) for site in report.modified_by] == [(5, "y.mul_(2)")]
    assert report.saved_by.file.startswith("<doctor-cell-")
    assert "modified by: aten::mul_ at <doctor-cell-" in stream.getvalue()

    silent = "x = torch.randn(3, requires_grad=True)\naux = x.exp()\naux.add_(1)\n(x * 2).sum().backward()\n"
    assert "modified in place before backward used it" in _run_cell(ipython_shell, "--check", silent)


def test_ipython_cell_magic_reports_a_graph_freed_twice(ipython_shell: Any) -> None:
    stream = io.StringIO()
    with redirect_stderr(stream), pytest.raises(inplace_doctor.GraphFreedError) as info:
        ipython_shell.run_cell_magic("doctor", "", CARRIED_STATE)
    (report,) = info.value.reports
    roles = [(role, site.line) for role, site in report.sites]
    assert roles == [("freed by", 5), ("carried by", 4), ("failed at", 5)]
    assert [patch.code for patch in report.patches] == ["h = torch.tanh(h.detach() @ w)"]
    assert "carried by:  MmBackward0 at <doctor-cell-" in stream.getvalue()


def test_ipython_cell_magic_reports_the_nan_origin(ipython_shell: Any) -> None:
    for options in ("--nan", "--check --nan"):
        stream = io.StringIO()
        with redirect_stderr(stream), pytest.raises(inplace_doctor.NanOriginError) as info:
            ipython_shell.run_cell_magic("doctor", options, NAN_SHARE)
        (report,) = info.value.reports
        assert [(role, site.op, site.line) for role, site in report.sites] == [("forward op", "div", 2)]
        assert report.sites[0][1].file.startswith("<doctor-cell-")
        assert "forward op:  div at <doctor-cell-" in stream.getvalue()
    assert _run_cell(ipython_shell, "--nan", NAN_SHARE_FIXED) == ""
    assert _run_cell(ipython_shell, "", NAN_SHARE) == ""
    assert "options: --check, --nan" in _run_cell(ipython_shell, "--nans", NAN_SHARE)
