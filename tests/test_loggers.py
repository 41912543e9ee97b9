"""The loggers of a run, read back with each tool's own reader: TensorBoard event files (and the hint
without it), MLflow runs through its client, W&B offline runs from their record file."""

from __future__ import annotations

import csv
import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from yolotrain import YoloLoss, train
from yolotrain.data import generate_shapes_dataset
from yolotrain.engine.loggers import TAGS, RunLoggers


def test_a_run_writes_scalars_lrs_and_a_validation_mosaic(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=8, n_val=4, img_size=64) / "data.yaml"
    run = train(data=str(data), epochs=2, img_size=64, batch_size=4, workers=0, autoanchor=False,
                project=str(tmp_path / "runs"))
    events = EventAccumulator(str(run.save_dir), size_guidance={"images": 0})
    events.Reload()
    tags = events.Tags()
    with (run.save_dir / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    for column, tag in (("train_box", "train/box_loss"), ("mAP50", "metrics/mAP_0.5"), ("lr0", "x/lr0"),
                        ("lr1", "x/lr1"), ("val_obj", "val/obj_loss")):
        assert tag in tags["scalars"], tag
        logged = events.Scalars(tag)
        assert [s.step for s in logged] == [1, 2]
        assert [s.value for s in logged] == pytest.approx([float(r[column]) for r in rows], rel=1e-5)
    assert "val/predictions" in tags["images"]
    image = events.Images("val/predictions")[0]
    assert image.width >= 320 and image.height >= 320 and image.step == 2


WRITE_WITHOUT_TENSORFLOW = """
import sys
from pathlib import Path
from yolotrain.engine.loggers import RunLoggers
run = Path(sys.argv[1])
loggers = RunLoggers(run, True, print)
for rows in ("1,0.5,0.25\\n", "1,0.5,0.25\\n2,0.4,0.5\\n"):
    (run / "results.csv").write_text("epoch,train_box,mAP50\\n" + rows)
    loggers.log_epoch(run / "results.csv")
loggers.close()
print("tensorflow imported:", "tensorflow" in sys.modules, "switch left:", "tensorboard.compat.notf" in sys.modules)
"""


def _events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return events


def test_event_files_are_written_without_importing_tensorflow(tmp_path):
    """Where TensorFlow is installed, tensorboard would import it (seconds of start-up and its log lines on
    stderr): a run's event files are written by tensorboard's stub, and read back the same."""
    pytest.importorskip("tensorboard")
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed: nothing to keep from being imported")
    result = subprocess.run([sys.executable, "-c", WRITE_WITHOUT_TENSORFLOW, str(tmp_path)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "tensorflow imported: False switch left: False"
    assert "absl" not in result.stderr and "oneDNN" not in result.stderr, result.stderr
    events = _events(tmp_path)
    assert [(s.step, s.value) for s in events.Scalars("train/box_loss")] == [(1, 0.5), (2, pytest.approx(0.4))]
    assert [(s.step, s.value) for s in events.Scalars("metrics/mAP_0.5")] == [(1, 0.25), (2, 0.5)]


def test_a_program_that_imported_tensorflow_keeps_it_for_tensorboard(tmp_path):
    """A program that already imported TensorFlow is not pointed at the stub (its TensorFlow stays
    tensorboard's), and the event files are written all the same."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("tensorflow")
    # TensorFlow after torch (TensorFlow imported before triton crashes the process, whoever imports them).
    code = (WRITE_WITHOUT_TENSORFLOW.replace("loggers = ", "import tensorflow\nloggers = ", 1) +
            "import tensorboard.compat\nprint(tensorboard.compat.tf.__version__ == tensorflow.__version__)\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == ["tensorflow imported: True switch left: False", "True"]
    events = _events(tmp_path)
    assert [s.step for s in events.Scalars("train/box_loss")] == [1, 2]


def test_without_tensorboard_one_hint_and_no_files(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    lines: list[str] = []
    loggers = RunLoggers(tmp_path, True, lines.append)
    (tmp_path / "results.csv").write_text("epoch,train_box\n1,0.5\n")
    loggers.log_epoch(tmp_path / "results.csv")
    loggers.close()
    assert len(lines) == 1 and "pip install tensorboard" in lines[0]
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["results.csv"]
    assert RunLoggers(tmp_path, False, lines.append).writer is None and len(lines) == 1


# --------------------------------------------------------------------- MLflow and W&B (--logger)
def _shapes(tmp_path: Path) -> Path:
    return generate_shapes_dataset(root=tmp_path / "shapes", n_train=8, n_val=4, img_size=64) / "data.yaml"


def _results(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "results.csv").open() as f:
        return list(csv.DictReader(f))


class _InterruptedInSecondEpoch(YoloLoss):
    """The training loss, with Ctrl-C at the first step of the second epoch (8 images, batches of 4)."""

    def __init__(self, model, rect_training: bool) -> None:
        super().__init__(model, rect_training=rect_training, img_size=64)
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 3:
            raise KeyboardInterrupt
        return super().__call__(*args, **kwargs)


def test_mlflow_logs_settings_epochs_and_weights_and_a_resumed_run_continues_its_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("alembic")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        train(loss=_InterruptedInSecondEpoch, data=str(_shapes(tmp_path)), epochs=3, img_size=64, batch_size=4,
              workers=0, autoanchor=False, tensorboard=False, loggers=("mlflow",), project=str(tmp_path / "runs"))
    run_dir = tmp_path / "runs" / "exp"
    saved = json.loads((run_dir / "loggers.json").read_text())["mlflow"]
    assert saved["tracking_uri"] == f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"  # the run folder's own store
    client = MlflowClient(saved["tracking_uri"])
    assert client.get_run(saved["run_id"]).info.status == "FAILED"

    resumed = train(resume=str(run_dir))
    assert resumed.save_dir == run_dir
    assert json.loads((run_dir / "loggers.json").read_text())["mlflow"] == saved  # the same MLflow run
    run = client.get_run(saved["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "exp"
    assert run.data.params["epochs"] == "3" and run.data.params["data.img_size"] == "64"
    assert run.data.params["loggers"] == "['mlflow']" and run.data.params["optim.optimizer"] == "SGD"
    rows = _results(run_dir)
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    for column in [c for c in rows[0] if c != "epoch"]:
        logged = sorted((m.step, m.value) for m in client.get_metric_history(saved["run_id"], column))
        assert [step for step, _ in logged] == [1, 2, 3], column
        assert [value for _, value in logged] == pytest.approx([float(r[column]) for r in rows], rel=1e-5), column
    artifacts = {a.path for a in client.list_artifacts(saved["run_id"], "weights")}
    assert artifacts == {f"weights/{n}.{s}" for n in ("best", "last") for s in ("safetensors", "json")}
    assert (run_dir / "mlruns").is_dir() and not (tmp_path / "mlruns").exists()


def test_mlflow_uses_the_tracking_uri_of_the_environment(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'tracking.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "shapes")
    monkeypatch.chdir(tmp_path)  # MLflow keeps the artifacts of such a store in ./mlruns
    run = train(data=str(_shapes(tmp_path)), epochs=1, img_size=64, batch_size=4, workers=0, autoanchor=False,
                tensorboard=False, plots=False, loggers=("mlflow",), project=str(tmp_path / "runs"))
    client = MlflowClient(uri)
    (logged,) = client.search_runs([client.get_experiment_by_name("shapes").experiment_id])
    row = _results(run.save_dir)[-1]
    assert logged.data.metrics["mAP50-95"] == pytest.approx(float(row["mAP50-95"]), rel=1e-5)
    assert not (run.save_dir / "mlflow.db").exists()
    assert client.list_artifacts(logged.info.run_id, "weights") and (tmp_path / "mlruns").is_dir()


def _wandb_records(path: Path):
    """The records of a W&B run file: its LevelDB-style log of 32 KiB blocks after a 7-byte header, each
    chunk ``crc32 (4) | length (2) | kind (1: full, 2: first, 3: middle, 4: last)``, each record a protobuf."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunks = 7, []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks.append(data[pos + 7:pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def test_wandb_offline_run_has_the_settings_and_each_epochs_results(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for name in ("DIR", "CONFIG_DIR", "CACHE_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        monkeypatch.setenv(f"WANDB_{name}", str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = train(data=str(_shapes(tmp_path)), epochs=2, img_size=64, batch_size=4, workers=0, autoanchor=False,
                tensorboard=False, plots=False, loggers=("wandb",), project=str(tmp_path / "runs"))
    wandb.teardown()  # the W&B service writes the run file in the background; this waits for it
    (run_file,) = (run.save_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history: dict[int, dict[str, float]] = {}
    kinds, artifacts = [], []
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        kinds.append(kind)
        if kind == "artifact":
            artifacts.append((record.artifact.type, record.artifact.name,
                              sorted(entry.path for entry in record.artifact.manifest.contents)))
        if kind == "run":
            assert (record.run.project, record.run.display_name) == ("runs", "exp")
            config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
            assert config["epochs"] == 2 and config["data"]["img_size"] == 64 and config["loggers"] == ["wandb"]
        elif kind == "history":
            values = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                      for item in record.history.item}
            history[int(values["_step"])] = values
    rows = _results(run.save_dir)
    assert "run" in kinds and kinds[-1] == "exit"
    assert sorted(history) == [1, 2]
    for row in rows:
        logged = history[int(row["epoch"])]
        for column, tag in TAGS.items():
            if column in row:  # a detection run: no segmentation columns
                assert logged[tag] == pytest.approx(float(row[column]), rel=1e-5), tag
    run_id = json.loads((run.save_dir / "loggers.json").read_text())["wandb"]["id"]
    assert run_id in run_file.name
    assert artifacts == [("model", f"run_{run_id}_model", ["best.json", "best.safetensors"])]


def test_without_logger_no_tracker_package_is_imported(tmp_path):
    data = _shapes(tmp_path)
    script = ("import sys; from yolotrain.cli import main; "
              f"rc = main(['train', '--data', {str(data)!r}, '--epochs', '1', '--img', '64', '--batch', '4', "
              "'--workers', '0', '--noautoanchor', '--no-plots', '--project', 'runs']); "
              "print(sorted(m for m in ('mlflow', 'wandb', 'comet_ml', 'clearml', 'neptune', 'dvclive') "
              "if m in sys.modules)); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
    assert (tmp_path / "runs" / "exp" / "results.csv").is_file()


def test_a_missing_package_is_one_line_before_training(tmp_path):
    """As if neither package were installed: ``sys.modules[name] = None`` makes ``import name`` fail."""
    script = ("import sys; sys.modules['mlflow'] = sys.modules['wandb'] = None; from yolotrain.cli import main; "
              "print(main(['train', '--logger', 'mlflow', '--project', 'runs']), "
              "main(['train', '--logger', 'wandb', '--project', 'runs']))")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "1 1"
    assert done.stderr.splitlines() == [
        "yolotrain train: error: --logger mlflow needs the mlflow package: pip install 'yolotrain[mlflow]'",
        "yolotrain train: error: --logger wandb needs the wandb package: pip install 'yolotrain[wandb]'"]
    assert not (tmp_path / "runs").exists()


def test_a_tracker_that_cannot_start_closes_the_ones_already_started(tmp_path, monkeypatch):
    """W&B online without an account fails at once: one-line error, and the MLflow run that had
    already started is closed as failed instead of staying RUNNING."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from yolotrain.engine.loggers import LoggerError

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    for name in ("DIR", "CONFIG_DIR", "CACHE_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        monkeypatch.setenv(f"WANDB_{name}", str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoggerError, match="--logger wandb could not start a run") as info:
        train(data=str(_shapes(tmp_path)), epochs=1, img_size=64, batch_size=4, workers=0, autoanchor=False,
              tensorboard=False, plots=False, loggers=("mlflow", "wandb"), project=str(tmp_path / "runs"))
    assert "\n" not in str(info.value)
    client = MlflowClient(f"sqlite:///{(tmp_path / 'runs' / 'exp').resolve() / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name(str(tmp_path / "runs")).experiment_id])
    assert run.info.status == "FAILED"
