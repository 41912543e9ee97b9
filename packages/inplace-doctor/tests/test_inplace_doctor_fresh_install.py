"""The distribution on its own: a fresh virtual environment with torch and nothing of the detection stack.

Slow (it installs torch into the new environment): ``pytest -m slow``. pip must be able to
reach torch (an index or a local wheel cache); the test skips when it cannot.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

PACKAGE = Path(__file__).resolve().parents[1]
REPOSITORY = PACKAGE.parents[1]


def _run(*command: str | Path, cwd: Path, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_installs_and_passes_its_tests_without_the_detection_stack(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path).check_returncode()
    python = venv / "bin" / "python"
    torch_version = torch.__version__.split("+")[0]
    installed = _run(python, "-m", "pip", "install", "-q", f"torch=={torch_version}", "pytest", "ipython", cwd=tmp_path)
    if installed.returncode != 0:
        pytest.skip(f"torch {torch_version} cannot be installed here: {installed.stderr[-300:]}")
    # A regular (not editable) install from the folder: the built distribution must carry everything.
    _run(python, "-m", "pip", "install", "-q", PACKAGE, cwd=tmp_path).check_returncode()
    missing = _run(python, "-c", "import importlib.util as u; print([m for m in ('cv2', 'yolotrain', 'matplotlib', "
                   "'pycocotools', 'torchvision') if u.find_spec(m)])", cwd=tmp_path)
    assert missing.stdout.strip() == "[]", missing.stdout + missing.stderr
    # The package's tests, against the installed copy (run from a folder where the source tree is not importable).
    tests = _run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", PACKAGE / "tests",
                 "--rootdir", PACKAGE, "-c", PACKAGE / "pyproject.toml", cwd=tmp_path)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and "skipped" not in tests.stdout, tests.stdout[-1500:]
    # The console script and the corpus's first failing program, from the repository when present.
    case = REPOSITORY / "tests" / "doctor_cases" / "backward_tensor_hook.py"
    if case.exists():
        report = _run(venv / "bin" / "inplace-doctor", "--json", case, cwd=REPOSITORY)
        assert report.returncode == 1 and '"in_backward": true' in report.stdout, report.stdout + report.stderr
