"""Multi-process training under torchrun (CPU, gloo): a restarted group, two nodes, the join timeout, a
segmentation model, a classifier, a pose and an oriented-box model."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from yolotrain.data import generate_shapes_dataset
from yolotrain.data.classify import write_shape_crops
from yolotrain.devices import check_gpu_list, gpu_list, select_device
from yolotrain.engine import distributed as D

QUICK = ["--img", "64", "--batch", "4", "--nominal-batch", "4", "--epochs", "3", "--workers", "1", "--no-val",
         "--seed", "3"]


@pytest.fixture(scope="module")
def sixteen_images(tmp_path_factory) -> Path:
    root = generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=16, n_val=4, img_size=64)
    return root / "data.yaml"


def torchrun(*args: str, cwd: Path, log: str) -> subprocess.Popen:
    """torchrun in the background, its output (progress bars and all) into the file ``cwd/log``: a pipe
    nobody reads while waiting would fill and stall the workers."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with (cwd / log).open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def finish(job: subprocess.Popen, cwd: Path, log: str, timeout: float = 300) -> str:
    job.wait(timeout=timeout)
    output = (cwd / log).read_text()
    assert job.returncode == 0, output[-3000:]
    return output


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def model_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "weights" / "last.safetensors"))


def test_a_restarted_group_finds_the_run_of_its_job(tmp_path):
    first = D.DistributedContext(rank=0, world_size=2, elastic_run_id="job-a")
    assert D.elastic_run_dir(first, tmp_path) is None  # a first launch starts a run of its own
    for name, run_id in (("exp", "job-b"), ("exp2", "job-a")):
        (tmp_path / name).mkdir()
        D.mark_elastic_run(D.DistributedContext(world_size=2, elastic_run_id=run_id), tmp_path / name)
    (tmp_path / "exp3").mkdir()
    (tmp_path / "exp3" / D.ELASTIC_MARKER).write_text("{not json")  # a marker cut short is skipped
    # Restarted, on this machine or another whose agent counts restarts differently.
    for restart_count in (1, 0):
        restarted = D.DistributedContext(rank=1, world_size=2, elastic_run_id="job-a", restart_count=restart_count)
        assert D.elastic_run_dir(restarted, tmp_path) == tmp_path / "exp2"
    assert D.elastic_run_dir(D.DistributedContext(restart_count=1), tmp_path) is None  # no agent, no job
    # Only rank 0 writes the marker.
    D.mark_elastic_run(D.DistributedContext(rank=1, world_size=2, elastic_run_id="job-c"), tmp_path / "exp3")
    assert "job-c" not in (tmp_path / "exp3" / D.ELASTIC_MARKER).read_text()


def test_a_missing_peer_is_one_line_after_the_join_timeout(monkeypatch):
    """Rank 1 of 2 with nobody serving the store: a DistributedError within the timeout, not a hang."""
    import socket
    from datetime import timedelta

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setattr(D, "JOIN_TIMEOUT", timedelta(seconds=1))
    started = time.monotonic()
    expected = r"^process 1 of 2 could not join the process group: .* \(processes wait 1 s for each other\)$"
    with pytest.raises(D.DistributedError, match=expected) as e:
        D.init_process_group(D.DistributedContext(rank=1, world_size=2), torch.device("cpu"))
    assert "\n" not in str(e.value)
    assert time.monotonic() - started < 30


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers through /proc")
def test_a_killed_worker_is_restarted_and_the_run_ends_as_uninterrupted(sixteen_images, tmp_path):
    """torchrun --max-restarts: one of two workers SIGKILLed in the second epoch; the agent restarts the
    group, which continues from the last checkpoint by itself and ends bit-equal to an uninterrupted run,
    each epoch once in results.csv."""
    common = ["--standalone", "--nproc_per_node", "2", "--max-restarts", "2", "-m", "yolotrain", "train",
              "--data", str(sixteen_images), *QUICK, "--project", "runs"]
    finish(torchrun(*common, "--name", "plain", cwd=tmp_path, log="plain.log"), tmp_path, "plain.log")
    job = torchrun(*common, "--name", "killed", cwd=tmp_path, log="killed.log")
    run_dir = tmp_path / "runs" / "killed"
    deadline = time.monotonic() + 240
    while not (run_dir / "weights" / "last.json").exists():
        assert job.poll() is None and time.monotonic() < deadline, (tmp_path / "killed.log").read_text()[-3000:]
        time.sleep(0.05)
    time.sleep(0.3)  # into the second epoch
    os.kill(children(job.pid)[-1], signal.SIGKILL)
    output = finish(job, tmp_path, "killed.log")
    assert "exitcode: -9" in output and "Resuming" in output, output[-3000:]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["killed", "plain"]
    epochs = [line.split(",")[0] for line in (run_dir / "results.csv").read_text().splitlines()[1:]]
    assert epochs == ["1", "2", "3"]
    plain_weights, resumed_weights = model_weights(tmp_path / "runs" / "plain"), model_weights(run_dir)
    assert plain_weights.keys() == resumed_weights.keys()
    assert all(torch.equal(plain_weights[k], resumed_weights[k]) for k in plain_weights)


@pytest.mark.slow
def test_two_processes_train_a_segmentation_model_and_score_its_masks(sixteen_images, tmp_path):
    """A segmentation model (the shapes dataset has polygons) trains under torchrun with two workers: the
    masks of each process's share reach the segmentation loss, and rank 0's final validation writes the
    mask columns of results.csv."""
    finish(torchrun("--standalone", "--nproc_per_node", "2", "-m", "yolotrain", "train", "--data", str(sixteen_images),
                    "--model", "yolov5n-seg", "--img", "64", "--batch", "4", "--epochs", "1", "--workers", "1",
                    "--project", "runs", "--name", "seg", cwd=tmp_path, log="seg.log"), tmp_path, "seg.log")
    (row,) = csv.DictReader((tmp_path / "runs" / "seg" / "results.csv").open())
    assert float(row["train_seg"]) > 0 and float(row["val_seg"]) > 0
    assert all(row[f"mask_{name}"] != "" for name in ("precision", "recall", "mAP50", "mAP50-95"))
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["seg"]  # one run, written by rank 0


@pytest.mark.slow
def test_two_processes_train_a_classifier_and_score_it(tmp_path):
    """A classifier trains under torchrun with two workers: each process takes its share of every batch of
    class-folder images, and rank 0's final validation writes the top-1/top-5 columns of results.csv."""
    crops = write_shape_crops(tmp_path / "crops", n_train=8, n_val=4, img_size=64)
    finish(torchrun("--standalone", "--nproc_per_node", "2", "-m", "yolotrain", "train", "--data", str(crops),
                    "--model", "yolov5n-cls", "--img", "32", "--batch", "4", "--epochs", "1", "--workers", "1",
                    "--project", "runs", "--name", "cls", cwd=tmp_path, log="cls.log"), tmp_path, "cls.log")
    (row,) = csv.DictReader((tmp_path / "runs" / "cls" / "results.csv").open())
    assert float(row["train_loss"]) > 0 and float(row["val_loss"]) > 0
    assert 0 <= float(row["top1"]) <= float(row["top5"]) <= 1
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["cls"]  # one run, written by rank 0


# The box tasks of the anchor-free head: the shapes' label variant, the model, and the loss part and metric
# columns of results.csv beyond detection's that the task's final validation and loss write.
ANCHOR_FREE_TASKS = {
    "pose": ("yolov8n-pose", "train_pose", ("pose_precision", "pose_recall", "pose_mAP50", "pose_mAP50-95")),
    "obb": ("yolov8n-obb", "train_angle", ()),
}


@pytest.mark.slow
@pytest.mark.parametrize("labels", list(ANCHOR_FREE_TASKS))
def test_two_processes_train_a_pose_or_oriented_box_model_and_score_it(labels, tmp_path):
    """A pose and an oriented-box model train under torchrun with two workers: each process's share of the
    keypoints or rotated boxes reaches the task's loss, rank 0 alone writes the run, its final validation the
    task's metric columns, and the checkpoint loads as a model of the task."""
    from yolotrain.interop import load_checkpoint
    from yolotrain.task import task_of

    model_name, loss_column, metric_columns = ANCHOR_FREE_TASKS[labels]
    data = generate_shapes_dataset(root=tmp_path / "data", n_train=8, n_val=4, img_size=64, labels=labels)
    output = finish(torchrun("--standalone", "--nproc_per_node", "2", "-m", "yolotrain", "train", "--data",
                             str(data / "data.yaml"), "--model", model_name, "--img", "64", "--batch", "4", "--epochs",
                             "1", "--workers", "1", "--project", "runs", "--name", labels, cwd=tmp_path,
                             log=f"{labels}.log"), tmp_path, f"{labels}.log")
    assert "on 2 process(es)" in output
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [labels]  # one run, written by rank 0
    (row,) = csv.DictReader((tmp_path / "runs" / labels / "results.csv").open())
    assert float(row[loss_column]) > 0 and float(row[loss_column.replace("train_", "val_")]) > 0
    for column in ("precision", "recall", "mAP50", "mAP50-95", *metric_columns):
        assert 0 <= float(row[column]) <= 1, (column, row[column])
    model, _ = load_checkpoint(tmp_path / "runs" / labels / "weights" / "last")
    assert task_of(model).name == labels


def test_mps_is_chosen_where_available_and_refused_in_one_line_elsewhere(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert select_device("mps") == torch.device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^device 'mps' requested but MPS .* not available on this machine$"):
        select_device("mps")


def test_a_gpu_list_gives_each_process_its_gpu(monkeypatch):
    assert gpu_list("0,1") == [0, 1] and gpu_list("2, 3") == [2, 3]
    assert gpu_list("0") == gpu_list("cpu") == gpu_list(None) == gpu_list("0,") == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert [select_device("2,3", rank) for rank in (0, 1)] == [torch.device("cuda", 2), torch.device("cuda", 3)]
    with pytest.raises(ValueError, match="lists 2 GPUs; process 2 has none"):
        select_device("2,3", 2)
    with pytest.raises(ValueError, match="only 4 CUDA device"):
        check_gpu_list([3, 4])
    command = D.launch_command(2, ["train", "--device", "0,1"])
    assert command[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "yolotrain",
                           "train", "--device", "0,1"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the one-line answer of a machine without CUDA")
def test_a_gpu_list_without_cuda_is_one_line(tmp_path, monkeypatch, capsys):
    from yolotrain.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--device", "0,1", "--epochs", "1"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "yolotrain train: error: device '0,1' requested but CUDA is not available on this machine; for several "
        "CPU processes launch with torchrun --nproc_per_node 2 and --device cpu"]
    assert not (tmp_path / "runs").exists()


# Largest weight difference allowed between 2 x 4 and 1 x 8 images per step with nothing split-dependent
# (float summation order alone): measured 3.5e-10 after 3 epochs on this CPU (benchmarks/results/ddp.json).
EQUIVALENCE_TOLERANCE = 1e-6


@pytest.mark.slow
def test_two_processes_train_the_model_of_one_and_validate_it_alike(tmp_path):
    """2 x 4 images with torchrun equal 1 x 8 in one process (model and EMA) where batch norm and the
    loss do not depend on the split; rank 0's final validation equals a single-process val."""
    from yolotrain import val

    out = tmp_path / "ddp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "bench_ddp.py"), "--modes",
                    "frozen", "--images", "16", "--epochs", "2", "--out", str(out), "--keep", str(tmp_path)],
                   env=env, check=True, capture_output=True, timeout=600)
    diff = json.loads(out.read_text())["runs"][0]["max_abs_weight_diff"]
    assert diff["model"] <= EQUIVALENCE_TOLERANCE and diff["ema"] <= EQUIVALENCE_TOLERANCE, diff
    # results.csv reports the loss over all images of each epoch, as the single process does.
    losses = [[float(row.split(",")[2]) for row in (tmp_path / name / "results.csv").read_text().splitlines()[1:]]
              for name in ("frozen-1x8", "frozen-2x4")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    last = tmp_path / "frozen-2x4" / "weights" / "last"
    recorded = json.loads(last.with_suffix(".json").read_text())["metrics"]
    data = next((tmp_path / "data").glob("*/data.yaml"))
    again = val(last, data, img_size=64, batch_size=8, workers=0, plots=False, verbose=False, fuse=False)
    assert (again.mp, again.mr, again.map50, again.map) == (
        recorded["precision"], recorded["recall"], recorded["mAP50"], recorded["mAP50-95"])


@pytest.mark.slow
def test_two_agents_as_two_nodes_train_one_run_over_four_workers(tmp_path):
    """Two torchrun agents on this machine acting as two nodes of two workers each (c10d rendezvous):
    rank 0 alone writes the one run folder, and the four workers together train the model one process
    trains with the whole batch (so each saw its own share of every global batch)."""
    import socket

    bench = str(Path(__file__).parents[1] / "benchmarks" / "bench_ddp.py")
    data = generate_shapes_dataset(root=tmp_path / "data", n_train=16, n_val=4, img_size=64) / "data.yaml"
    worker = [bench, "train", "frozen", "--data", str(data), "--batch", "8", "--epochs", "2", "--optimizer", "SGD"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, *worker, "--project", str(tmp_path / "single"), "--name", "exp"], env=env,
                   check=True, capture_output=True, timeout=300)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [torchrun("--nnodes", "2", "--node-rank", str(rank), "--nproc_per_node", "2", "--rdzv-backend", "c10d",
                      "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes", *worker, "--project",
                      str(tmp_path / "runs"), "--name", "exp", cwd=tmp_path, log=f"node{rank}.log")
             for rank in (0, 1)]
    outputs = [finish(node, tmp_path, f"node{rank}.log") for rank, node in enumerate(nodes)]
    assert "on 4 process(es)" in outputs[0] and "on 4 process(es)" not in outputs[1]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["exp"]
    single, both = model_weights(tmp_path / "single" / "exp"), model_weights(tmp_path / "runs" / "exp")
    params = [k for k in single if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert max(float((single[k] - both[k]).abs().max()) for k in params) <= EQUIVALENCE_TOLERANCE


@pytest.mark.slow
def test_a_restart_after_the_last_epoch_was_saved_finishes_at_once(tmp_path, monkeypatch):
    """A worker that dies on its way out, after the final checkpoint: the restarted job has nothing left
    to train and ends with the run's result, rather than failing on "nothing to resume"."""
    from yolotrain import train
    from yolotrain.engine.trainer import _elastic_restart

    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=4, n_val=2, img_size=64) / "data.yaml"
    quick = {"data": str(data), "img_size": 64, "batch_size": 4, "epochs": 1, "workers": 0, "plots": False,
             "autoanchor": False, "tensorboard": False, "project": str(tmp_path / "runs")}
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first = train(**quick)
    assert (first.save_dir / D.ELASTIC_MARKER).is_file()
    saved = (first.save_dir / "weights" / "last.safetensors").read_bytes()
    # The same job id launched again later: a finished run of an earlier job is left alone.
    assert _elastic_restart(tmp_path / "runs", None, None, None) is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    again = train(**quick)
    assert (again.save_dir, again.epochs_run, again.metrics) == (first.save_dir, 0, first.metrics)
    assert (first.save_dir / "weights" / "last.safetensors").read_bytes() == saved
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [first.save_dir.name]


def test_a_one_line_error_under_torchrun_is_the_agents_root_cause(tmp_path):
    """A worker's one-line error becomes its error file: the agent's failure summary shows the line, not "To
    enable traceback see ...". (The agent still prints its own ChildFailedError traceback: RELIABILITY.md.)"""
    job = torchrun("--standalone", "--nproc_per_node", "1", "-m", "yolotrain", "train", "--img", "0",
                   "--device", "cpu", cwd=tmp_path, log="error.log")
    job.wait(timeout=300)
    output = (tmp_path / "error.log").read_text()
    line = "yolotrain train: error: data.img_size: must be at least 32, got 0"
    assert job.returncode == 1, output[-3000:]
    assert f"  traceback : {line}\n" in output and "To enable traceback see" not in output, output[-3000:]
    assert not (tmp_path / "runs").exists()
