"""``yolotrain tune``: the search space from the typed settings, pruning, resuming a killed study, and several
processes sharing one study."""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from yolotrain.data import generate_shapes_dataset
from yolotrain.engine.config import resolve_config
from yolotrain.settings import ConfigError
from yolotrain.tuning import TuneError, tune
from yolotrain.tuning.space import Parameter, default_space, read_space

FAST = {"epochs": 1, "img_size": 32, "batch_size": 4, "nominal_batch": 4, "workers": 0, "autoanchor": False,
        "plots": False, "tensorboard": False}
CLI_FAST = ["--epochs", "1", "--img", "32", "--batch", "4", "--workers", "0", "--noautoanchor", "--no-tensorboard",
            "--no-plots"]
SMALL_SPACE = {"lr0": [0.001, 0.02], "mosaic": [0.0, 1.0]}


@pytest.fixture(scope="module")
def tune_data(tmp_path_factory) -> Path:
    """A smaller shapes dataset than conftest's tiny_data (4 training, 2 validation images of 32 px): every
    trial or generation trains on it."""
    root = generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=4, n_val=2, img_size=32)
    return root / "data.yaml"


def load_study(folder: Path, name: str = "exp") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{folder / 'study.db'}")


def test_the_default_space_is_the_reference_evolution_within_the_settings_bounds():
    space = {p.name: p for p in default_space()}
    assert {"lr0", "momentum", "box", "hsv_h", "mosaic", "mixup"} <= set(space)
    assert "iou_t" not in space and "fl_gamma" not in space  # unused here / not mutated by the reference
    assert space["lr0"].log and (space["lr0"].low, space["lr0"].high) == (1e-5, 0.1)
    resolve_config(**{p.name: p.low for p in space.values()})  # both ends are valid settings
    resolve_config(**{p.name: p.high for p in space.values()})


def test_a_space_file_narrows_settings_by_their_kinds(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("lr0: [0.001, 0.01]\nclose_mosaic: {low: 0, high: 5}\noptimizer: [SGD, AdamW]\n"
                    "cos_lr: {}\nhsv_h: {}\nweight_decay: {low: 0.0001, high: 0.001, log: true}\n")
    assert read_space(path) == (Parameter("lr0", "float", 0.001, 0.01, log=True),
                                Parameter("close_mosaic", "int", 0, 5),
                                Parameter("optimizer", "choice", choices=("SGD", "AdamW")),
                                Parameter("cos_lr", "choice", choices=(True, False)),
                                Parameter("hsv_h", "float", 0, 1),
                                Parameter("weight_decay", "float", 0.0001, 0.001, log=True))


@pytest.mark.parametrize("text, message", [
    ("", "the search space is empty"),
    ("{}", "the search space is empty"),
    ("[lr0, mosaic]", "expected a mapping of settings"),
    ("lr0: [0.01\n", "space.yaml:2: not valid YAML"),
    ("lr00: [0.001, 0.01]", "unknown setting 'lr00'; did you mean 'lr0'"),
    ("epochs: [1, 5]", "'epochs' is a run setting, not a hyper-parameter"),
    ("lr0: [0.01, 0.001]", "lr0: low 0.01 is above high 0.001"),
    ("lr0: [0.001, 0.01, 0.1]", "lr0: a range is [low, high]"),
    ("mosaic: [0.0, 2.0]", "augment.mosaic: must be at most 1, got 2"),
    ("mosaic: [low, 1.0]", "augment.mosaic: expected a number"),
    ("lr0: {low: 0.001}", "lr0: the setting declares no upper bound; give high"),
    ("lr0: {low: 0.001, hihg: 0.1}", "unknown setting 'hihg'; did you mean 'high'"),
    ("optimizer: [SGD, Adamw]", "optim.optimizer: expected one of"),
    ("weight_decay: {low: 0, high: 0.001, log: true}", "a log-scaled range needs low > 0"),
    ("mosaic: 0.5", "mosaic: expected [low, high]"),
])
def test_a_malformed_space_is_one_named_error(tmp_path, text, message):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        read_space(path)
    assert message in str(error.value) and "\n" not in str(error.value)


SPACE_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=True) | st.sampled_from(["SGD", "low", ""]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["low", "high", "log", "choices", "step"]), inner, max_size=4), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["lr0", "mosaic", "optimizer", "cos_lr", "close_mosaic", "epochs", "lr00",
                                        "decay", "nominal_batch"]), SPACE_VALUES, max_size=4))
def test_any_space_mapping_is_a_space_or_one_named_error(values):
    try:
        space = read_space(values)
    except ConfigError as error:
        assert "\n" not in str(error)
        return
    for parameter in space:
        if parameter.kind != "choice":
            assert parameter.low <= parameter.high
            resolve_config(**{parameter.name: parameter.low})  # both ends are valid settings
            resolve_config(**{parameter.name: parameter.high})
        else:
            for choice in parameter.choices:
                resolve_config(**{parameter.name: choice})


def test_the_command_line_reports_an_empty_space_in_one_line(tmp_path, monkeypatch, capsys):
    from yolotrain.cli import main

    (tmp_path / "space.yaml").write_text("# nothing to search\n")
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--space", "space.yaml", "--trials", "2"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "yolotrain tune: error: space.yaml: the search space is empty: name the settings to search, e.g. "
        "'lr0: [0.001, 0.02]'"]
    assert not (tmp_path / "runs").exists()


def test_a_trial_behind_the_pruner_is_stopped_and_reported_pruned(tune_data, tmp_path, capsys):
    result = tune(data=str(tune_data), project=str(tmp_path), trials=1, space=SMALL_SPACE,
                  pruner=optuna.pruners.ThresholdPruner(lower=2.0), **{**FAST, "epochs": 2})
    assert result.trials["PRUNED"] == 1 and result.best_trial is None
    out = capsys.readouterr().out
    assert "tune: trial 0 pruned after epoch 1: fitness" in out
    rows = list(csv.DictReader((tmp_path / "exp" / "trials.csv").open()))
    assert [(r["trial"], r["state"], r["epochs"]) for r in rows] == [("0", "pruned", "1")]
    assert len((tmp_path / "exp" / "trials" / "trial0" / "results.csv").read_text().splitlines()) == 2  # 1 epoch


def test_a_trial_left_running_by_a_dead_process_is_failed_and_retried(tune_data, tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    study = optuna.create_study(study_name="exp", storage=f"sqlite:///{folder / 'study.db'}", direction="maximize")
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = study.ask({"lr0": optuna.distributions.FloatDistribution(0.001, 0.02, log=True),
                        "mosaic": optuna.distributions.FloatDistribution(0.0, 1.0)})
    orphan.set_user_attr("host", socket.gethostname())
    orphan.set_user_attr("pid", dead.pid)
    result = tune(data=str(tune_data), project=str(tmp_path), trials=1, space=SMALL_SPACE, **FAST)
    trials = load_study(folder).get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert trials[1].params == trials[0].params and trials[1].system_attrs["failed_trial"] == 0
    assert result.best_trial == 1 and (folder / "best_hyp.yaml").is_file()
    best = yaml.safe_load((folder / "best_hyp.yaml").read_text())
    config = resolve_config(hyp=folder / "best_hyp.yaml", data=str(tune_data))  # loads as a --hyp file
    assert config.optim.lr0 == pytest.approx(trials[1].params["lr0"]) == pytest.approx(best["lr0"])
    assert (folder / "optimization_history.png").is_file()


def test_a_study_of_other_settings_is_refused(tune_data, tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    study = optuna.create_study(study_name="exp", storage=f"sqlite:///{folder / 'study.db'}")
    study.set_user_attr("yolotrain", {"settings": {}, "space": []})
    with pytest.raises(TuneError, match="study 'exp' in sqlite:.* was started with other settings: give another"):
        tune(data=str(tune_data), project=str(tmp_path), trials=1, space=SMALL_SPACE, **FAST)


def tune_command(data: Path, trials: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "yolotrain", "tune", "--data", str(data), "--trials", str(trials), "--project",
            "runs", *CLI_FAST, *extra]


def space_file(folder: Path) -> str:
    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump(SMALL_SPACE))
    return str(path)


@pytest.mark.slow
def test_two_processes_share_one_study_without_running_a_trial_twice(tune_data, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = tune_command(tune_data, 4, "--space", space_file(tmp_path), "--pruner", "none")
    processes = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=900)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    folder = tmp_path / "runs" / "exp"
    trials = load_study(folder).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 4
    for t in trials:  # each trial trained once, in its own folder
        assert len((folder / "trials" / f"trial{t.number}" / "results.csv").read_text().splitlines()) == 2
    started = [line for out in outputs for line in out.splitlines() if line.startswith("tune: trial") and
               "finished" in line]
    assert len(started) == 4
    assert (folder / "param_importances.png").is_file() and (folder / "optimization_history.png").is_file()


@pytest.mark.slow
def test_a_killed_tune_continues_where_it_stood(tune_data, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = tune_command(tune_data, 3, "--space", space_file(tmp_path), "--sampler", "genetic")
    folder = tmp_path / "runs" / "exp"
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (folder / "trials" / "trial1" / "config.yaml").exists():
            assert process.poll() is None and time.monotonic() < deadline, "trial 1 never started"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        process.kill()
    killed = load_study(folder).get_trials()
    assert [t.state.name for t in killed] == ["COMPLETE", "RUNNING"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    trials = load_study(folder).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert trials[2].params == trials[1].params and trials[2].system_attrs["failed_trial"] == 1
    assert "trial 1 was left running by process" in done.stdout


def test_tuning_without_optuna_is_one_line_naming_the_extra(monkeypatch, capsys):
    from yolotrain.cli import main

    monkeypatch.setitem(sys.modules, "optuna", None)  # as if not installed: importing it raises ImportError
    assert main(["tune", "--trials", "1"]) == 1
    assert capsys.readouterr().err.strip() == \
        "yolotrain tune: error: tuning needs Optuna: pip install 'yolotrain[tune]'"


def mutation_study(values: list[float]) -> optuna.Study:
    """An in-memory study of finished trials over SMALL_SPACE, the i-th with fitness values[i]."""
    from yolotrain.tuning.samplers import distribution

    space = read_space(SMALL_SPACE)
    study = optuna.create_study(direction="maximize")
    for i, value in enumerate(values):
        study.add_trial(optuna.trial.create_trial(
            params={"lr0": 0.001 * (i + 1), "mosaic": 0.1 * i}, value=value,
            distributions={p.name: distribution(p) for p in space}))
    return study


def test_the_genetic_sampler_mutates_the_finished_trial_within_the_space():
    from yolotrain.tuning.samplers import ReferenceMutationSampler, suggest

    space = read_space(SMALL_SPACE)
    study = mutation_study([0.5])  # one parent: lr0 0.001, mosaic 0.0
    study.sampler = ReferenceMutationSampler(space, seed=0)
    parent = study.trials[0].params
    changed = 0
    for _ in range(20):
        trial = study.ask()
        values = suggest(trial, space)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)  # not a parent: every child is of the one parent
        assert 1 <= values["lr0"] / parent["lr0"] <= 3 and values["mosaic"] == 0.0  # 0 stays 0; lr0 at its low
        changed += values["lr0"] != parent["lr0"]
    assert changed >= 5


@pytest.mark.parametrize("name", ["tpe", "cmaes", "genetic"])
def test_every_sampler_searches_the_space(name):
    from yolotrain.tuning.samplers import suggest
    from yolotrain.tuning.study import _sampler

    space = read_space({**SMALL_SPACE, "optimizer": ["SGD", "AdamW"], "close_mosaic": [0, 3]})
    sampler = _sampler(optuna, name, space, resolve_config(lr0=0.005))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(lambda trial: -abs(suggest(trial, space)["lr0"] - 0.01), n_trials=8)
    assert all(0.001 <= t.params["lr0"] <= 0.02 and t.params["optimizer"] in ("SGD", "AdamW") and
               isinstance(t.params["close_mosaic"], int) for t in study.trials)
    assert len({t.params["lr0"] for t in study.trials}) > 1


@pytest.mark.parametrize("url", ["nosuchdb://host/db", "sqlite:////nonexistent-folder/sub/study.db"])
def test_a_storage_that_cannot_be_opened_is_one_line(tmp_path, url):
    with pytest.raises(TuneError, match=r"^--storage .*: cannot open the study's database \(.+\)$"):
        tune(project=str(tmp_path), storage=url, trials=1, space=SMALL_SPACE, **FAST)


@pytest.mark.parametrize("name, kind", [("median", optuna.pruners.MedianPruner),
                                        ("hyperband", optuna.pruners.HyperbandPruner),
                                        ("none", optuna.pruners.NopPruner)])
def test_every_pruner_name_builds_its_pruner(name, kind):
    from yolotrain.tuning.study import _pruner

    assert isinstance(_pruner(optuna, name, resolve_config(epochs=7)), kind)
