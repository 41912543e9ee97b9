"""The configuration tree: resolution order, data-dependent defaults, validation, the generated CLI."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import yaml

from yolotrain.cli import UNSUPPORTED_TRAIN_OPTIONS, build_parser, main
from yolotrain.data.augment import AugmentConfig
from yolotrain.engine.config import TrainConfig, resolve_config
from yolotrain.engine.trainer import ResumeOptions
from yolotrain.settings import ConfigError, flat_names, leaves


def test_defaults_depend_on_the_data():
    shapes = resolve_config()
    assert (shapes.data.img_size, shapes.epochs, shapes.optim.optimizer, shapes.optim.lr0,
            shapes.optim.nominal_batch) == (160, 30, "AdamW", 0.002, 16)
    real = resolve_config(data="x.yaml")
    assert (real.data.img_size, real.epochs, real.optim.optimizer, real.optim.lr0,
            real.optim.nominal_batch) == (640, 100, "SGD", 0.01, 64)
    assert resolve_config(data="x.yaml", img_size=320).data.img_size == 320
    # A learning rate tuned for the preset optimiser does not carry over to another one.
    assert resolve_config(optimizer="SGD").optim.lr0 == 0.01
    assert resolve_config(data="x.yaml", optimizer="Adam").optim.lr0 == 0.001
    # Resolved means complete: only the weights to start from (None: the model's own), the device (None: a
    # GPU when present), the W&B entity (None: the account's own), the data (None: shapes) and a classifier's
    # dropout (None: as built) stay open.
    unset = [path for path, _, _ in leaves(TrainConfig) if functools.reduce(getattr, path.split("."), shapes) is None]
    assert unset == ["pretrained", "device", "entity", "data.path", "classify.dropout"]


def test_layers_files_then_keywords(tmp_path):
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text("lr0: 0.03\nmosaic: 0.5\nbox: 0.07\nwarmup_epochs: 1\n")
    config = resolve_config(hyp=hyp, data="d.yaml", lr0=0.02, fliplr=0.0)
    assert config.optim.lr0 == 0.02  # the keyword wins over the file
    assert (config.augment.mosaic, config.augment.fliplr, config.loss.box, config.optim.warmup_epochs) == \
        (0.5, 0.0, 0.07, 1.0)
    assert config.augment.hsv_s == AugmentConfig.hsv_s  # untouched settings keep their defaults
    # Whole sections, as mappings or objects, and a saved config.yaml as the base.
    assert resolve_config(optim={"lr0": 0.05}).optim.lr0 == 0.05
    assert resolve_config(augment=AugmentConfig(mosaic=0.0)).augment.mosaic == 0.0
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(config.to_dict()))
    assert resolve_config(saved) == config
    assert resolve_config(saved, epochs=7).epochs == 7


def test_round_trip_and_frozen():
    config = resolve_config(data="d.yaml", lr0=0.02, mosaic=0.25)
    assert TrainConfig.from_dict(config.to_dict()) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 3  # type: ignore[misc]


@pytest.mark.parametrize(("settings", "message"), [
    ({"mosiac": 0.5}, "unknown setting 'mosiac'; did you mean 'mosaic'?"),
    ({"lr_0": 0.5}, "unknown setting 'lr_0'; did you mean 'lr0'?"),
    ({"img_size": 100}, "data.img_size: must be a positive multiple of 32, got 100"),
    ({"img_size": 0}, "data.img_size: must be at least 32, got 0"),
    ({"img_size": -64}, "data.img_size: must be at least 32, got -64"),
    ({"nominal_batch": 0}, "optim.nominal_batch: must be at least 1, got 0"),
    ({"lr0": -1.0}, "optim.lr0: must be greater than 0, got -1"),
    ({"lr0": float("nan")}, "optim.lr0: expected a number or null, got nan"),
    ({"epochs": "ten"}, "epochs: expected an integer or null, got 'ten'"),
    ({"epochs": 2.5}, "epochs: expected an integer or null, got 2.5"),
    ({"rect": "yes"}, "data.rect: expected true or false, got 'yes'"),
    ({"optimizer": "Lion"}, "optim.optimizer: expected one of 'SGD', 'Adam', 'AdamW', 'auto' or null, got 'Lion'"),
    ({"optim": {"lr00": 0.1}}, "optim: unknown setting 'lr00'; did you mean 'lr0'?"),
])
def test_one_error_type_naming_the_setting(settings, message):
    with pytest.raises(ConfigError) as caught:
        resolve_config(**settings)
    assert str(caught.value) == message


def test_hyper_parameter_files_are_checked(tmp_path):
    bad = tmp_path / "typo.yaml"
    bad.write_text("fliplr: 0.0\nmosiac: 0.0\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: unknown setting 'mosiac'; did you mean 'mosaic'\?"):
        resolve_config(hyp=bad)
    run_setting = tmp_path / "epochs.yaml"
    run_setting.write_text("epochs: 3\n")
    with pytest.raises(ConfigError, match="'epochs' is a run setting, not a hyper-parameter.*--epochs"):
        resolve_config(hyp=run_setting)
    broken = tmp_path / "broken.yaml"
    broken.write_text("lr0: 0.01\nmosaic: [1.0\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:3: not valid YAML"):
        resolve_config(hyp=broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- lr0\n")
    with pytest.raises(ConfigError, match="expected a mapping of settings, got list"):
        resolve_config(hyp=listed)
    with pytest.raises(FileNotFoundError, match="hyper-parameter file not found"):
        resolve_config(hyp=tmp_path / "missing.yaml")


def test_every_setting_has_one_option_with_its_default_in_the_help():
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    by_dest = {action.dest: action for action in train._actions}
    for path, field, _ in [*leaves(TrainConfig), *leaves(ResumeOptions)]:
        action = by_dest[field.name]
        assert field.metadata["help"] in action.help, path
        if field.default not in (None, ()):
            assert f"(default {field.default})" in action.help, path
    reference_only = {flag.lstrip("-").replace("-", "_") for flag in UNSUPPORTED_TRAIN_OPTIONS}
    settings = set(flat_names(TrainConfig)) | set(flat_names(ResumeOptions))
    commands = {"help", "config", "hyp", "resume", "evolve", "cfg", "weights", "local_rank"}
    assert settings >= set(by_dest) - commands - reference_only
    args = train.parse_args(["--img", "320", "--no-val", "--mosaic", "0.5", "--optimizer", "Adam"])
    given = {k: v for k, v in vars(args).items() if k != "run"}
    assert given == {"config": None, "hyp": None, "resume": False, "evolve": None, "cfg": None, "img_size": 320,
                     "val": False, "mosaic": 0.5, "optimizer": "Adam"}


@pytest.mark.parametrize(("argv", "message"), [
    (["--img", "0"], "data.img_size: must be at least 32, got 0"),
    (["--img", "-64"], "data.img_size: must be at least 32, got -64"),
    (["--nominal-batch", "0"], "optim.nominal_batch: must be at least 1, got 0"),
    (["--lr0", "-0.1"], "optim.lr0: must be greater than 0"),
    (["--fliplr", "1.5"], "augment.fliplr: must be at most 1, got 1.5"),
    (["--resume", "--epochs", "5"], "only device and workers may change (got epochs)"),
    (["--logger", "mlflow", "wandbb"], "loggers: expected a list of 'mlflow', 'wandb', 'comet', 'clearml', "
                                       "'neptune', 'dvc', got ['mlflow', 'wandbb']; did you mean 'wandb'?"),
])
def test_cli_settings_errors_are_one_line(argv, message, capsys):
    assert main(["train", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("yolotrain train: error: ") and message in err[0], err


def test_logger_lists_from_options_files_and_keywords(tmp_path):
    args = build_parser().parse_args(["train", "--logger", "mlflow,wandb"])
    assert resolve_config(loggers=args.loggers).loggers == ("mlflow", "wandb")
    assert resolve_config(loggers="wandb").loggers == ("wandb",) and resolve_config().loggers == ()
    (tmp_path / "config.yaml").write_text("loggers: [mlflow]\n")
    assert resolve_config(tmp_path / "config.yaml").loggers == ("mlflow",)
    with pytest.raises(ConfigError, match=r"got 'ml-flow'; did you mean 'mlflow'\?"):
        resolve_config(loggers="ml-flow")
