"""``--verify-fix``: each proposed patch is run on a copy of the program, and only patches that ran are proposed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import inplace_doctor
import pytest
from inplace_doctor.cli import AUTO_VERIFY_ENV

PACKAGE_PATH = str(Path(inplace_doctor.__file__).parents[1])

# Reads a file relative to the working directory, so the patched copy must run where the user ran it.
INPLACE = textwrap.dedent(
    """
    import torch

    steps = int(open("steps.txt").read())
    w = torch.randn(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    for step in range(steps):
        probs = torch.sigmoid(w * 2)
        probs += 1e-6
        loss = probs.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("trained", steps, "steps")
    """
).lstrip()

CARRIED_STATE = textwrap.dedent(
    """
    import torch

    cell = torch.nn.GRUCell(4, 8)
    opt = torch.optim.SGD(cell.parameters(), lr=0.1)
    h = torch.zeros(2, 8)
    for step in range(4):
        x = torch.randn(2, 4)
        h = cell(x, h)
        loss = h.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    """
).lstrip()

# Two independent in-place faults: backward meets the second first, and its patch leaves the first to fail.
TWO_FAULTS = textwrap.dedent(
    """
    import torch

    w = torch.randn(3, requires_grad=True)
    probs = torch.sigmoid(w)
    probs += 1e-6
    gate = torch.exp(w)
    gate.mul_(2)
    (probs.sum() + gate.sum()).backward()
    """
).lstrip()

# The fault is in a module beside the script, so the patch changes that module's copy.
HELPER = textwrap.dedent(
    """
    def activate(x):
        y = x.sigmoid()
        y.mul_(2)
        return y
    """
).lstrip()
USES_HELPER = textwrap.dedent(
    """
    import torch
    from helper import activate

    w = torch.randn(3, requires_grad=True)
    for step in range(2):
        activate(w).sum().backward()
    """
).lstrip()

CLEAN = "import torch\n\nw = torch.randn(3, requires_grad=True)\nw.sigmoid().sum().backward()\nprint('clean')\n"


# A heatmap's argmax as a keypoint's predicted column: an integer result the soft-argmax candidate replaces.
ARGMAX = textwrap.dedent(
    """
    import torch

    net = torch.nn.Linear(8, 16)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(2):
        heatmap = net(torch.randn(4, 8))
        column = torch.argmax(heatmap, dim=1).float()
        loss = (column - 7.5).abs().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    """
).lstrip()


def _doctor(folder: Path, *args: str, auto_verify_s: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m inplace_doctor ARGS`` in ``folder``, writing no bytecode so the folder's listing is comparable;
    ``auto_verify_s`` sets ``INPLACE_DOCTOR_AUTO_VERIFY_S`` (the parent's value, or the default, if None)."""
    paths = [PACKAGE_PATH, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONWARNINGS="ignore", PYTHONDONTWRITEBYTECODE="1")
    if auto_verify_s is not None:
        env[AUTO_VERIFY_ENV] = auto_verify_s
    return subprocess.run([sys.executable, "-m", "inplace_doctor", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_inplace_patch_is_verified_and_the_users_files_are_unchanged(tmp_path: Path) -> None:
    folder = _project(tmp_path, {"train.py": INPLACE, "steps.txt": "3"})
    before = _listing(folder)
    proc = _doctor(folder, "--verify-fix", "train.py")
    assert proc.returncode == 1, proc.stderr  # the program as written still failed
    assert "change:      train.py:8 to\n                   probs = probs + 1e-6" in proc.stderr
    assert "verify-fix:  verified: the patched program ran 3 steps without the error" in proc.stderr
    assert _listing(folder) == before


def test_verification_is_in_the_json_report(tmp_path: Path) -> None:
    folder = _project(tmp_path, {"train.py": INPLACE, "steps.txt": "2"})
    report = json.loads(_doctor(folder, "--json", "--verify-fix", "train.py").stdout)
    assert report["patches"] == [{"file": "train.py", "line": 8, "code": "probs = probs + 1e-6"}]
    assert report["verification"] == {
        "verified": True,
        "detail": "verified: the patched program ran 2 steps without the error",
        "steps": 2,
        "tried": report["patches"],
    }


def test_carried_state_patch_is_verified(tmp_path: Path) -> None:
    folder = _project(tmp_path, {"rnn.py": CARRIED_STATE})
    proc = _doctor(folder, "--verify-fix", "rnn.py")
    assert "h = cell(x, h.detach())" in proc.stderr
    assert "verified: the patched program ran 4 steps without the error" in proc.stderr


def test_patch_in_a_module_beside_the_script_is_verified_on_copies(tmp_path: Path) -> None:
    folder = _project(tmp_path, {"train.py": USES_HELPER, "helper.py": HELPER})
    before = _listing(folder)
    proc = _doctor(folder, "--verify-fix", "train.py")
    assert "change:      helper.py:3 to\n                   y = y.mul(2)" in proc.stderr
    assert "verified: the patched program ran 2 steps without the error" in proc.stderr
    assert _listing(folder) == before


def test_patch_that_leaves_another_fault_is_not_proposed(tmp_path: Path) -> None:
    folder = _project(tmp_path, {"two_faults.py": TWO_FAULTS})
    proc = _doctor(folder, "--verify-fix", "two_faults.py")
    assert proc.returncode == 1
    assert "change:" not in proc.stderr
    assert "fix:         `.mul_()` works in place; use the out-of-place `y = y.mul(...)`" in proc.stderr  # reasoning
    assert ("verify-fix:  no patch was verified: with `gate = gate.mul(2)` at two_faults.py:7, "
            "the patched program still failed (exit code 1): doctor error: one of the variables needed") in proc.stderr
    report = json.loads(_doctor(folder, "--json", "--verify-fix", "two_faults.py").stdout)
    assert report["patches"] == []
    assert report["verification"]["verified"] is False
    assert report["verification"]["tried"] == [{"file": "two_faults.py", "line": 7, "code": "gate = gate.mul(2)"}]


def test_patched_copy_that_runs_past_the_timeout_is_not_verified(tmp_path: Path) -> None:
    folder = _project(tmp_path, {"train.py": INPLACE + "import time\ntime.sleep(60)\n", "steps.txt": "1"})
    proc = _doctor(folder, "--verify-fix", "--verify-timeout", "1", "train.py")
    assert "no patch was verified: with `probs = probs + 1e-6` at train.py:8, " \
           "the patched program timed out after 1 s" in proc.stderr


@pytest.mark.parametrize("verify", [(), ("--verify-fix",)])
def test_clean_program_has_nothing_to_verify(tmp_path: Path, verify: tuple[str, ...]) -> None:
    folder = _project(tmp_path, {"clean.py": CLEAN})
    proc = _doctor(folder, *verify, "clean.py")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "clean\n", "")


def test_short_program_is_verified_by_default_and_not_when_turned_off(tmp_path: Path) -> None:
    folder = _project(tmp_path, {"train.py": INPLACE, "steps.txt": "2"})
    patches = [{"file": "train.py", "line": 8, "code": "probs = probs + 1e-6"}]
    report = json.loads(_doctor(folder, "--json", "train.py", auto_verify_s="600").stdout)
    assert report["verification"]["verified"] is True and report["patches"] == patches
    for args, limit in [(("--no-verify-fix",), "600"), ((), "0")]:
        report = json.loads(_doctor(folder, "--json", *args, "train.py", auto_verify_s=limit).stdout)
        assert "verification" not in report and report["patches"] == patches


def test_soft_argmax_candidate_is_proposed_once_it_ran(tmp_path: Path) -> None:
    folder = _project(tmp_path, {"keypoint.py": ARGMAX})
    report = json.loads(_doctor(folder, "--json", "--verify-fix", "keypoint.py").stdout)
    soft = "column = (heatmap.softmax(1) * torch.arange(heatmap.shape[1], device=heatmap.device)).sum(1).float()"
    assert report["patches"] == [{"file": "keypoint.py", "line": 7, "code": soft}]
    assert report["fix"].endswith(f"; a run verified the change `{soft}` at keypoint.py:7")
    assert report["verification"]["verified"] is True and report["verification"]["steps"] == 2
    unverified = json.loads(_doctor(folder, "--json", "--no-verify-fix", "keypoint.py").stdout)
    assert unverified["patches"] == [] and "verification" not in unverified
