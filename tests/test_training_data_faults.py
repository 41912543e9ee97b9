"""Faults of the data side while `yolotrain train` runs, in real processes: a loader process killed, the
dataset folder moved away. Each ends in one line naming what happened, and the last checkpoint loads."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from yolotrain.checkpoint import read_checkpoint
from yolotrain.data import generate_shapes_dataset

ARGS = ["train", "--epochs", "50", "--img", "64", "--batch", "4", "--no-val", "--no-plots", "--project", "runs",
        "--cache-mb", "0"]  # no memory cache: every epoch reads the images again


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=12, n_val=4, img_size=64)


def start(cwd: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """``yolotrain`` in a process of its own, its stderr to a file (a pipe nobody reads would fill up)."""
    log = cwd / "stderr.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("w") as err:
        process = subprocess.Popen([sys.executable, "-m", "yolotrain", *args], cwd=cwd, env=env,
                                   stdout=subprocess.DEVNULL, stderr=err)
    return process, log


def children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (the loader processes of a training process)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def wait_for(condition, process: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"training ended early: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def assert_stopped_in_one_line(process: subprocess.Popen, log: Path, run: Path, *expected: str) -> None:
    process.wait(timeout=120)
    stderr = log.read_text()
    assert process.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0] == stderr.strip().splitlines()[-1], stderr[-3000:]
    for text in expected:
        assert text in errors[0], errors[0]
    assert f"the last checkpoint {Path('runs') / run.name / 'weights' / 'last'}.safetensors is intact" in errors[0]
    read_checkpoint(run / "weights" / "last")


@pytest.mark.slow
def test_a_killed_loader_process_stops_training_in_one_line(shapes, tmp_path):
    process, log = start(tmp_path, *ARGS, "--data", str(shapes / "data.yaml"), "--workers", "2", "--name", "killed")
    run = tmp_path / "runs" / "killed"
    try:
        wait_for(lambda: (run / "weights" / "last.json").exists() and children(process.pid), process, log)
        os.kill(children(process.pid)[0], signal.SIGKILL)
        assert_stopped_in_one_line(process, log, run, "training stopped: a data-loading process died")
    finally:
        process.kill()


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_dataset_moved_away_during_training_stops_in_one_line(shapes, tmp_path, workers):
    data = tmp_path / "data"
    shutil.copytree(shapes, data)
    process, log = start(tmp_path, *ARGS, "--data", str(data / "data.yaml"), "--workers", workers, "--name", "moved")
    run = tmp_path / "runs" / "moved"
    try:
        wait_for(lambda: (run / "weights" / "last.json").exists(), process, log)
        data.rename(tmp_path / "elsewhere")
        assert_stopped_in_one_line(process, log, run, "training stopped: cannot read image",
                                   f"{data} no longer exists")
    finally:
        process.kill()
