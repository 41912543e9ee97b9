"""The training engine end to end: the real command in subprocesses on tiny data."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import YOLOV5N_WEIGHTS
from safetensors.torch import load_file

from yolotrain import YoloLoss, train
from yolotrain.interop import load_checkpoint, load_model

TINY = ["--img", "64", "--batch", "4", "--workers", "0"]


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "yolotrain", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def weights(json_path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(json_path.with_suffix(".safetensors")))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_train_writes_a_complete_run(tiny_data, tmp_path):
    result = run_cli("train", "--data", str(tiny_data), "--epochs", "2", *TINY, "--project", "runs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "runs" / "exp"
    for name in ("weights/last.safetensors", "weights/last.json", "weights/last.state.pt",
                 "weights/best.safetensors", "weights/best.json", "results.csv", "results.png",
                 "confusion_matrix.png", "PR_curve.png", "val_predictions/00000.jpg", "train_batch0.jpg"):
        assert (run / name).is_file(), name
    rows = (run / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("epoch,train_box,train_obj,train_cls,precision")
    meta = json.loads((run / "weights" / "last.json").read_text())
    assert meta["names"] == ["circle", "rectangle"] and meta["epoch"] == 1 and meta["img_size"] == 64
    assert meta["train_args"]["epochs"] == 2 and "mAP50-95" in meta["metrics"]
    model, _ = load_checkpoint(run / "weights" / "best")
    assert model.num_classes == 2 and model.names == ["circle", "rectangle"]
    assert "mAP50-95" in result.stderr + result.stdout and "Done: 2 epoch(s)" in result.stderr + result.stdout
    # A second run goes to a new folder.
    again = run_cli("train", "--data", str(tiny_data), "--epochs", "1", *TINY, "--project", "runs", "--no-val",
                    cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "runs" / "exp2" / "weights" / "last.json").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (["--data", "missing/data.yaml"], "missing/data.yaml"),
    (["--model", "yolov5q"], "unknown model 'yolov5q': a YOLOv5 size"),
    (["--device", "gpu7"], "bad device 'gpu7'"),
    (["--model", "nothere.pt"], "nothere.pt"),
])
def test_bad_arguments_fail_in_one_line(tiny_data, tmp_path, args, message):
    full = ["train", "--epochs", "1", *TINY, "--project", "runs", *(["--data", str(tiny_data)] if "--data" not in args
                                                                   else []), *args]
    result = run_cli(*full, cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_empty_dataset_fails_in_one_line(tmp_path):
    for split in ("train", "val"):
        (tmp_path / "empty" / "images" / split).mkdir(parents=True)
    (tmp_path / "empty" / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: [a]\n")
    result = run_cli("train", "--data", "empty/data.yaml", *TINY, "--epochs", "1", cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_resume_after_kill_keeps_the_runs_settings(tiny_data, tmp_path):
    """A run started with a hyper-parameter file and --lr0, killed after an epoch and resumed with
    --resume alone, ends where the uninterrupted run ends: the checkpoint carries the resolved values."""
    (tmp_path / "hyp.yaml").write_text("lrf: 0.2\nwarmup_bias_lr: 0.02\nbox: 0.08\nmosaic: 0.5\nfliplr: 0.1\n")
    args = ["train", "--data", str(tiny_data), "--epochs", "3", *TINY, "--project", "runs", "--no-val",
            "--hyp", "hyp.yaml", "--lr0", "0.004"]
    whole = run_cli(*args, "--name", "whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "yolotrain", *args, "--name", "cut"], cwd=tmp_path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = tmp_path / "runs" / "cut" / "weights" / "last.json"
    deadline = time.monotonic() + 240
    while not last.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert last.exists()
    stopped_after = json.loads(last.read_text())["epoch"]
    assert stopped_after < 2, "the run finished before it could be interrupted"
    saved = json.loads(last.read_text())["train_args"]
    assert (saved["optim"]["lr0"], saved["optim"]["lrf"], saved["loss"]["box"], saved["augment"]["mosaic"]) == \
        (0.004, 0.2, 0.08, 0.5)
    assert "hyp" not in saved  # values, not a path to a file that may change or vanish
    (tmp_path / "hyp.yaml").unlink()

    refused = run_cli("train", "--resume", str(last), "--epochs", "5", cwd=tmp_path)
    assert refused.returncode != 0 and "only device and workers may change (got epochs)" in refused.stderr
    resumed = run_cli("train", "--resume", str(last), "--workers", "0", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"cut from epoch {stopped_after + 2}/3" in resumed.stdout
    a, b = weights(tmp_path / "runs" / "whole" / "weights" / "last.json"), weights(last)
    assert a.keys() == b.keys()
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-5
    assert json.loads(last.read_text())["epoch"] == 2
    assert yaml.safe_load((tmp_path / "runs" / "cut" / "config.yaml").read_text()) == saved


def test_divergence_stops_with_a_message_and_keeps_the_last_checkpoint(tiny_data, tmp_path):
    base = ["--data", str(tiny_data), "--img", "64", "--batch", "2", "--workers", "0", "--project", "runs",
            "--name", "exp", "--no-val"]
    good = run_cli("train", *base, "--epochs", "1", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    last = tmp_path / "runs" / "exp" / "weights" / "last"
    digests = {p.name: sha256(p) for p in last.parent.iterdir()}
    start = tmp_path / "start"  # a copy: a run may not start from weights inside the run folder it writes
    start.mkdir()
    for member in last.parent.glob("last.*"):
        shutil.copy(member, start / member.name)

    (tmp_path / "hyp.yaml").write_text("warmup_epochs: 0\n")
    bad = run_cli("train", *base, "--exist-ok", "--epochs", "2", "--model", str(start / "last.json"), "--lr0", "1e30",
                  "--nominal-batch", "2", "--hyp", "hyp.yaml", cwd=tmp_path)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    message = bad.stderr.strip().splitlines()[-1]
    assert "diverged at epoch 1, step" in message and "learning rate" in message and "1e+30" in message
    assert "the last good checkpoint is runs/exp/weights/last.safetensors" in message
    assert {p.name: sha256(p) for p in last.parent.iterdir()} == digests


def start_of_training(**config) -> tuple[dict[str, torch.Tensor], Path]:
    """Train briefly; return the weights the first step started from and the run's last checkpoint."""
    started = {}

    def criterion(model, rect_training):  # called once the model is built, before any step
        started.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        return YoloLoss(model, rect_training)

    # AutoAnchor would refit the anchors of these tiny images; here the checkpoint's must be kept.
    result = train(loss=criterion, img_size=64, batch_size=4, epochs=1, workers=0, val=False, plots=False,
                   autoanchor=False, **config)
    return started, result.last


@pytest.mark.parametrize("source", ["official", "ours"])
def test_fine_tuning_keeps_backbone_and_neck_and_gives_a_new_head_for_other_classes(tiny_data, tmp_path, source,
                                                                                   coco_mini):
    """--model CHECKPOINT with another class count: every backbone and neck tensor and the anchors
    start as the checkpoint's; the Detect convolutions start fresh with the dataset's classes."""
    if source == "official":
        if not YOLOV5N_WEIGHTS.is_file():
            pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
        checkpoint = YOLOV5N_WEIGHTS
    else:
        checkpoint = tmp_path / "ours" / "weights" / "last.json"
        start_of_training(data=str(coco_mini), model="yolov5n", project=str(tmp_path), name="ours")
    pretrained = load_model(checkpoint)
    assert pretrained.num_classes == 80
    started, last = start_of_training(data=str(tiny_data), model=str(checkpoint), project=str(tmp_path / "runs"))

    head = "model.24.m."
    assert started[head + "0.weight"].shape[0] == 3 * (5 + 2)
    for name, tensor in pretrained.state_dict().items():
        if not name.startswith(head):
            assert torch.equal(started[name], tensor), name
    model, _ = load_checkpoint(last)
    assert model.num_classes == 2 and model.names == ["circle", "rectangle"]


def test_fine_tuning_on_the_same_classes_keeps_the_head(tmp_path, coco_mini):
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
    started, last = start_of_training(data=str(coco_mini), model=str(YOLOV5N_WEIGHTS), project=str(tmp_path))
    pretrained = load_model(YOLOV5N_WEIGHTS).state_dict()
    assert started.keys() == pretrained.keys()
    assert all(torch.equal(started[k], v) for k, v in pretrained.items())
    assert load_checkpoint(last)[0].names[:2] == ["person", "bicycle"]


def test_two_process_step_equals_one_process_step(tiny_data, tmp_path):
    """torchrun with 2 CPU processes (gloo): one step on a global batch of 2 equals one process's step.

    Both images are the same picture without augmentation, so each rank's BatchNorm statistics equal
    the global batch's (CPU has no SyncBatchNorm) and the comparison is exact. In float32: bfloat16's
    8-bit mantissa rounds the two gradient sums (one batch of 2, two averaged batches of 1) apart.
    """
    source = sorted((tiny_data.parent / "images" / "train").iterdir())[0]
    label = tiny_data.parent / "labels" / "train" / (source.stem + ".txt")
    for split in ("train", "val"):
        (tmp_path / "twin" / "images" / split).mkdir(parents=True)
        (tmp_path / "twin" / "labels" / split).mkdir(parents=True)
        for name in ("a", "b"):
            (tmp_path / "twin" / "images" / split / f"{name}{source.suffix}").write_bytes(source.read_bytes())
            (tmp_path / "twin" / "labels" / split / f"{name}.txt").write_text(label.read_text())
    (tmp_path / "twin" / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\n"
                                                 "names: [circle, rectangle]\n")
    (tmp_path / "hyp.yaml").write_text("mosaic: 0\nfliplr: 0\nhsv_h: 0\nhsv_s: 0\nhsv_v: 0\ntranslate: 0\n"
                                       "scale: 0\nwarmup_epochs: 0\n")
    args = ["train", "--data", "twin/data.yaml", "--img", "64", "--batch", "2", "--nominal-batch", "2",
            "--epochs", "1", "--workers", "0", "--hyp", "hyp.yaml", "--project", "runs", "--no-val", "--amp", "off"]
    single = run_cli(*args, "--name", "single", cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "yolotrain", *args, "--name", "ddp"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "on 2 process(es)" in ddp.stdout
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["ddp", "single"]  # rank 0 alone writes
    a = weights(tmp_path / "runs" / "single" / "weights" / "last.json")
    b = weights(tmp_path / "runs" / "ddp" / "weights" / "last.json")
    # Parameters; BatchNorm running variances differ by design (unbiased over fewer values per rank).
    model_keys = [k for k in a if k.startswith("model.") and not k.endswith(("running_var", "num_batches_tracked"))]
    diffs = {k: (a[k] - b[k]).abs().max().item() for k in model_keys}
    assert max(diffs.values()) <= 1e-5, sorted(diffs.items(), key=lambda kv: -kv[1])[:3]
    # The DDP checkpoint loads in a single process.
    model, _ = load_checkpoint(tmp_path / "runs" / "ddp" / "weights" / "last")
    assert model.num_classes == 2


@pytest.mark.slow
def test_default_command_reaches_map50_half(tmp_path):
    """`yolotrain train` with no arguments: yolov5n on the shapes dataset, a few CPU minutes."""
    result = run_cli("train", "--project", "runs", cwd=tmp_path, timeout=1800)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads((tmp_path / "runs" / "exp" / "weights" / "best.json").read_text())["metrics"]
    assert metrics["mAP50"] >= 0.5, metrics
