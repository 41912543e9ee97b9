"""Kills at every window of a checkpoint save, and at random moments: the run resumes and ends
bit-equal to an uninterrupted one, with gradient accumulation on and nothing lost."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from yolotrain.checkpoint import read_checkpoint
from yolotrain.data import generate_shapes_dataset

# 12 images in batches of 4 with the reference's accumulation (nominal batch 64) and warm-up: the
# third epoch ends with gradients accumulated but not yet applied, which a resume must carry over.
EPOCHS = 4
ARGS = ["train", "--epochs", str(EPOCHS), "--img", "64", "--batch", "4", "--workers", "0", "--no-val",
        "--project", "runs"]
SAVE_POINTS = ("written", "set-aside", "renamed", "committed")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    root = generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=12, n_val=4, img_size=64)
    return str(root / "data.yaml")


def run(cwd: Path, *args: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("YOLOTRAIN_KILL_AT", None)
    if kill_at:
        env["YOLOTRAIN_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "yolotrain", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "weights" / "last.safetensors"))


def assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differing, f"{len(differing)} of {len(a)} tensors differ, e.g. {differing[0]}"


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory) -> dict[str, torch.Tensor]:
    cwd = tmp_path_factory.mktemp("whole")
    result = run(cwd, *ARGS, "--data", data, "--name", "whole")
    assert result.returncode == 0, result.stderr
    return final_weights(cwd / "runs" / "whole")


def resume_until_done(cwd: Path, run_dir: Path, attempts: int = 5) -> None:
    for _ in range(attempts):
        result = run(cwd, "train", "--resume", str(run_dir), "--workers", "0")
        if result.returncode == 0:
            return
        assert "nothing to resume" not in result.stderr, result.stderr
    raise AssertionError(f"did not finish after {attempts} resumes: {result.stderr[-2000:]}")


@pytest.mark.parametrize("point", SAVE_POINTS)
def test_kill_in_each_window_of_a_save_resumes_bit_equal(point, data, uninterrupted, tmp_path):
    killed = run(tmp_path, *ARGS, "--data", data, "--name", "cut", kill_at=f"{point}:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run_dir = tmp_path / "runs" / "cut"
    # The newest complete set loads: epoch 3's when the kill came after its json, else epoch 2's.
    contents = read_checkpoint(run_dir / "weights" / "last")
    assert contents.metadata["epoch"] == (2 if point == "committed" else 1)
    resume_until_done(tmp_path, run_dir)
    assert_bit_equal(uninterrupted, final_weights(run_dir))
    leftovers = [p.name for p in (run_dir / "weights").iterdir() if p.name.startswith(".")]
    assert not leftovers, leftovers
    rows = (run_dir / "results.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == [str(e) for e in range(1, EPOCHS + 1)]


@pytest.mark.slow
def test_random_kills_lose_nothing(data, uninterrupted, tmp_path):
    """SIGKILL at random moments (30 kills over repeated resumes, then the last run finishes): every
    interrupted run resumes, and the result equals the uninterrupted run bit for bit. The tally is
    printed for RELIABILITY.md."""
    rng = random.Random(0)
    kills, resumed_runs, finished = 0, 0, 0
    whole_seconds = None
    while kills < 30:
        cwd = tmp_path / f"run{finished}"
        cwd.mkdir()
        run_dir = cwd / "runs" / "cut"
        args = [*ARGS, "--data", data, "--name", "cut", "--exist-ok"]  # a kill before any save starts over
        while True:
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            started = time.monotonic()
            process = subprocess.Popen([sys.executable, "-m", "yolotrain", *args], cwd=cwd, env=env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            delay = rng.uniform(0.5, whole_seconds or 8.0) if kills < 30 else None  # then let it finish
            try:
                process.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
                process.wait()
                kills += 1
            if process.returncode == 0:
                whole_seconds = whole_seconds or time.monotonic() - started
                break
            stderr = process.stderr.read()
            if "already finished all" in stderr:  # the kill came after the final save: nothing left to do
                break
            assert process.returncode == -signal.SIGKILL, stderr
            if (run_dir / "weights" / "last.json").exists():
                json.loads((run_dir / "weights" / "last.json").read_text())  # never a torn json
                read_checkpoint(run_dir / "weights" / "last")
                args = ["train", "--resume", str(run_dir), "--workers", "0"]
                resumed_runs += 1
        assert_bit_equal(uninterrupted, final_weights(run_dir))
        finished += 1
    print(f"\nrandom kills: {kills}, resumes: {resumed_runs}, runs finished: {finished}, all bit-equal, "
          "no checkpoint lost or unreadable")


def test_a_failed_save_stops_training_in_one_line_and_keeps_the_last_checkpoint(data, tmp_path, monkeypatch):
    from yolotrain.checkpoint import read_checkpoint as read
    from yolotrain.engine import Trainer, TrainingError, resolve_config

    config = resolve_config(data=data, img_size=64, batch_size=4, epochs=3, workers=0, val=False, plots=False,
                            project=str(tmp_path))
    trainer = Trainer(config)
    real_save, saves = torch.save, []

    def disk_full_on_second_save(obj, f, *args, **kwargs):
        saves.append(f)
        if len(saves) == 2:
            raise OSError(28, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_on_second_save)
    with pytest.raises(TrainingError) as caught:
        trainer.fit()
    message = str(caught.value)
    assert "could not save the checkpoint" in message and "at epoch 2 (No space left on device)" in message
    assert "the previous one is intact and loadable" in message and "\n" not in message
    assert read(tmp_path / "exp" / "weights" / "last").metadata["epoch"] == 0
