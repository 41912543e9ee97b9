"""Comet, ClearML, Neptune and DVC (``--logger comet clearml neptune dvc``), each offline with no server,
read back from the records the tool itself writes in the run folder: a run interrupted in its second epoch
and resumed logs each of its three epochs once, with ``results.csv``'s values, into the same tracker run."""

from __future__ import annotations

import csv
import json
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from yolotrain import YoloLoss, train
from yolotrain.data import generate_shapes_dataset
from yolotrain.engine.loggers import TAGS

History = dict[int, dict[str, float]]  # epoch → the reference's tag → value


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


def _interrupted_and_resumed(tmp_path: Path, logger: str) -> tuple[Path, dict[str, str], dict[str, str]]:
    """A 3-epoch run stopped in epoch 2 and resumed: its folder, and the tracker's state after each part."""
    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=8, n_val=4, img_size=64) / "data.yaml"
    with pytest.raises(KeyboardInterrupt):
        train(loss=_InterruptedInSecondEpoch, data=str(data), epochs=3, img_size=64, batch_size=4, workers=0,
              autoanchor=False, tensorboard=False, loggers=(logger,), project=str(tmp_path / "runs"))
    run_dir = tmp_path / "runs" / "exp"
    first = json.loads((run_dir / "loggers.json").read_text())[logger]
    assert train(resume=str(run_dir)).save_dir == run_dir
    return run_dir, first, json.loads((run_dir / "loggers.json").read_text())[logger]


def _assert_history_is_results_csv(history: History, run_dir: Path) -> None:
    with (run_dir / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    assert sorted(history) == [1, 2, 3]
    for row in rows:
        logged = history[int(row["epoch"])]
        columns = [c for c in row if c in TAGS]
        assert len(columns) == len(row) - 1  # every column but the epoch has its tag
        for column in columns:
            assert logged[TAGS[column]] == pytest.approx(float(row[column]), rel=1e-6), column


def _validation_images(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "val_predictions").glob("*.jpg"))


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Path:
    """No server configured for any tracker, their home-folder settings and caches under ``tmp_path``."""
    home = tmp_path / "home"
    for name in ("COMET_API_KEY", "COMET_PROJECT_NAME", "COMET_OFFLINE", "NEPTUNE_API_TOKEN", "NEPTUNE_PROJECT",
                 "NEPTUNE_MODE", "NEPTUNE_DATA_DIRECTORY", "CLEARML_API_ACCESS_KEY", "CLEARML_API_SECRET_KEY",
                 "CLEARML_API_HOST", "CLEARML_CACHE_DIR", "CLEARML_OFFLINE_MODE", "DVC_STUDIO_TOKEN",
                 "DVCLIVE_RESUME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("COMET_CONFIG", str(home / ".comet.config"))
    monkeypatch.setenv("CLEARML_CONFIG_FILE", str(home / "clearml.conf"))
    monkeypatch.setenv("DVC_STUDIO_OFFLINE", "true")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "true")
    monkeypatch.setenv("DVC_GLOBAL_CONFIG_DIR", str(home / "dvc-global"))
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(home / "dvc-site"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------------------------------------- Comet
def _comet_archives(folder: Path) -> list[tuple[dict, list[dict]]]:
    """Each offline archive's experiment.json and messages, in the order the sessions started."""
    archives = []
    for path in folder.glob("*.zip"):
        with zipfile.ZipFile(path) as archive:
            messages = [json.loads(line) for line in archive.read("messages.json").decode().splitlines() if line]
            archives.append((json.loads(archive.read("experiment.json")), messages))
    return sorted(archives, key=lambda a: a[0]["start_time"])


def _comet_settings(messages: list[dict]):
    """(name, value) of the parameters logged by the run (Comet's own are "auto-logged"); a list value
    comes as a "params" message."""
    for message in messages:
        if message["type"] == "parameter_msg":
            param = message["payload"].get("param") or message["payload"]["params"]
            if param["source"] == "manual":
                yield param["paramName"], param["paramValue"]


def test_comet_offline_experiment_continued_by_the_resumed_run(offline):
    pytest.importorskip("comet_ml")
    run_dir, first, state = _interrupted_and_resumed(offline, "comet")
    assert state == first
    archives = _comet_archives(run_dir / "comet")
    assert len(archives) == 2  # one per session, both appending to the same experiment when uploaded
    history: History = {}
    for experiment, messages in archives:
        assert experiment["offline_id"] == state["key"] and experiment["project_name"] == "runs"
        assert experiment["resume_strategy"] == "get_or_create"
        for message in messages:
            if message["type"] == "metric_msg":
                metric = message["payload"]["metric"]
                if metric["metricName"] in TAGS.values():
                    assert metric["epoch"] == metric["step"]
                    history.setdefault(metric["step"], {})[metric["metricName"]] = metric["metricValue"]
    _assert_history_is_results_csv(history, run_dir)
    first_messages, last_messages = archives[0][1], archives[1][1]
    params = dict(_comet_settings(first_messages))
    assert params["epochs"] == 3 and params["data|img_size"] == 64 and params["optim|optimizer"] == "SGD"
    assert params["loggers"] == ["comet"]  # a list: Comet's "params" message
    assert not list(_comet_settings(last_messages))  # the settings once
    uploads = [m["payload"]["additional_params"] for m in last_messages if m["type"] == "file_upload"]
    assert sorted(u["figName"] for u in uploads if "figName" in u) == \
        [f"val_predictions/{name}" for name in _validation_images(run_dir)]
    assert sorted((u["groupingName"], u["fileName"]) for u in uploads if u.get("type") == "model-element") == \
        [("best", "best.json"), ("best", "best.safetensors")]
    assert not any(m["type"] == "file_upload" for m in first_messages)  # an interrupted run logs no weights
    assert {"type": "log_other", "key": "Name", "value": "exp"} in [
        {"type": m["type"], "key": m["payload"].get("key"), "value": m["payload"].get("value")} for m in first_messages]


# ---------------------------------------------------------------------------------------------- ClearML
def test_clearml_offline_task_continued_by_the_resumed_run(offline):
    pytest.importorskip("clearml")
    run_dir, first, state = _interrupted_and_resumed(offline, "clearml")
    assert state == first and state["id"].startswith("offline-")
    session = run_dir / "clearml" / "offline" / state["id"]
    assert session.with_suffix(".zip").is_file()  # what Task.import_offline_session takes
    assert [p.name for p in (run_dir / "clearml" / "offline").iterdir() if p.is_dir()] == [state["id"]]
    history: History = {}
    images = []
    for line in (session / "metrics.jsonl").read_text().splitlines():
        for event in json.loads(line):
            if event["type"] == "training_stats_scalar":
                history.setdefault(event["iter"], {})[f"{event['metric']}/{event['variant']}"] = event["value"]
            elif event["type"] == "training_debug_image":
                images.append((event["metric"], event["variant"], event["iter"], Path(event["url"]).is_file()))
    _assert_history_is_results_csv(history, run_dir)
    assert images == [("val_predictions", name, 3, True) for name in _validation_images(run_dir)]
    task = json.loads((session / "task.json").read_text())
    assert (task["project_name"], task["name"]) == ("runs", "exp")
    settings = task["hyperparams"]["settings"]
    assert settings["epochs"]["value"] == "3" and settings["data/img_size"]["value"] == "64"
    artifacts = {a["key"]: Path(a["uri"]) for a in task["execution"]["artifacts"]}
    assert sorted(artifacts) == ["weights/best.json", "weights/best.safetensors"]
    assert artifacts["weights/best.safetensors"].read_bytes() == (run_dir / "weights" / "best.safetensors").read_bytes()


# ---------------------------------------------------------------------------------------------- Neptune
def _neptune_operations(folder: Path) -> list[list[dict]]:
    """The operations of each offline run under ``folder`` (Neptune's disk queue: one JSON a line)."""
    runs = []
    for run in sorted(folder.glob("offline/run__*"), key=lambda p: json.loads((p / "metadata.json").read_text())
                      ["createdAt"]):
        assert json.loads((run / "metadata.json").read_text())["mode"] == "offline"
        runs.append([json.loads(line)["obj"] for log in sorted(run.glob("data-*.log"))
                     for line in log.read_text().splitlines() if line])
    return runs


def test_neptune_offline_run_data_in_the_run_folder(offline):
    pytest.importorskip("neptune")
    run_dir, first, state = _interrupted_and_resumed(offline, "neptune")
    assert state == first and len(state["custom_run_id"]) == 32
    sessions = _neptune_operations(run_dir / ".neptune")
    # Offline, each session of the run is an offline run of its own (online, the custom id joins them).
    assert len(sessions) == 2 and not (offline / ".neptune").exists()
    history: History = {}
    for operations in sessions:
        assert {"type": "AssignString", "path": ["sys", "name"], "value": "exp"} in operations
        for op in operations:
            if op["type"] == "LogFloats" and op["path"][0] != "monitoring":
                for point in op["values"]:
                    history.setdefault(int(point["step"]), {})["/".join(op["path"])] = point["value"]
    _assert_history_is_results_csv(history, run_dir)
    params = {"/".join(op["path"][1:]): op["value"] for op in sessions[0] if op["path"][0] == "parameters"}
    assert params["epochs"] == 3 and params["data/img_size"] == 64 and params["optim/optimizer"] == "SGD"
    assert not any(op["path"][0] == "parameters" for op in sessions[1])
    uploads = [op for op in sessions[1] if op["type"] in ("UploadFile", "UploadFileSet")
               and op["path"][0] != "source_code"]
    assert sorted(Path(op["file_path"]).name for op in uploads if op["type"] == "UploadFile") == \
        _validation_images(run_dir)
    (weights,) = [op for op in uploads if op["type"] == "UploadFileSet"]
    assert weights["path"] == ["weights", "best"]
    assert sorted(Path(f).name for f in weights["file_globs"]) == ["best.json", "best.safetensors"]
    assert {"type": "AssignBool", "path": ["sys", "failed"], "value": True} in sessions[0]


# -------------------------------------------------------------------------------------------------- DVC
def test_dvclive_files_in_the_run_folder_continued_by_the_resumed_run(offline):
    pytest.importorskip("dvclive")
    run_dir, first, state = _interrupted_and_resumed(offline, "dvc")
    live = run_dir / "dvclive"
    assert state == first == {"dir": str(live)}
    history: History = {}
    plots = live / "plots" / "metrics"
    for tsv in plots.rglob("*.tsv"):
        tag = tsv.relative_to(plots).with_suffix("").as_posix()
        with tsv.open() as f:
            for row in csv.DictReader(f, delimiter="\t"):
                assert int(row["step"]) not in history.get(tag, {})  # each epoch once
                history.setdefault(int(row["step"]), {})[tag] = float(row[tag.rsplit("/", 1)[-1]])
    _assert_history_is_results_csv(history, run_dir)
    summary = json.loads((live / "metrics.json").read_text())
    assert summary["step"] == 3 and summary["train"]["box_loss"] == history[3]["train/box_loss"]
    params = yaml.safe_load((live / "params.yaml").read_text())
    assert params["epochs"] == 3 and params["data"]["img_size"] == 64 and params["loggers"] == ["dvc"]
    assert sorted(p.name for p in (live / "plots" / "images" / "val_predictions").iterdir()) == \
        _validation_images(run_dir)
    dvcyaml = yaml.safe_load((run_dir / "dvc.yaml").read_text())
    assert dvcyaml["params"] == ["dvclive/params.yaml"] and dvcyaml["metrics"] == ["dvclive/metrics.json"]
    assert dvcyaml["plots"] == [{"dvclive/plots/metrics": {"x": "step"}}, "dvclive/plots/images"]


def test_dvclive_declares_the_best_weights_as_a_model_inside_a_dvc_repository(offline):
    pytest.importorskip("dvclive")
    from dvc.repo import Repo

    Repo.init(str(offline), no_scm=True)  # the run starts in a DVC repository without Git (the fixture's cwd)
    data = generate_shapes_dataset(root=offline / "shapes", n_train=8, n_val=4, img_size=64) / "data.yaml"
    run = train(data=str(data), epochs=1, img_size=64, batch_size=4, workers=0, autoanchor=False,
                tensorboard=False, plots=False, loggers=("dvc",), project=str(offline / "runs"))
    dvcyaml = yaml.safe_load((run.save_dir / "dvc.yaml").read_text())
    assert dvcyaml["artifacts"] == {"best": {"path": "weights/best.safetensors", "type": "model",
                                             "desc": "best weights of exp"}}
    assert (run.save_dir / "weights" / "best.safetensors.dvc").is_file()  # tracked by DVC
    assert "plots" in dvcyaml and "dvclive/plots/images" not in dvcyaml["plots"]  # --no-plots: no images


# ----------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(("logger", "module"), [("comet", "comet_ml"), ("clearml", "clearml"),
                                                 ("neptune", "neptune"), ("dvc", "dvclive")])
def test_a_missing_tracker_package_is_one_line_naming_its_extra(tmp_path, monkeypatch, capsys, logger, module):
    from yolotrain.cli import main

    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: `import module` fails
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--logger", logger, "--project", "runs"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"yolotrain train: error: --logger {logger} needs the {module} package: pip install 'yolotrain[{logger}]'"]
    assert not (tmp_path / "runs").exists()


def test_neptune_online_without_a_project_is_one_line(offline, monkeypatch):
    """A token but no project: Neptune cannot start a run, which stops the run before training."""
    pytest.importorskip("neptune")
    from yolotrain.engine.loggers import LoggerError, RunLoggers

    monkeypatch.setenv("NEPTUNE_API_TOKEN", "not-a-token")
    with pytest.raises(LoggerError, match="--logger neptune could not start a run") as info:
        RunLoggers(offline / "exp", False, print, integrations=("neptune",), config={"project": "runs"})
    assert "\n" not in str(info.value)

