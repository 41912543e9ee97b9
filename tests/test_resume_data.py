"""A resumed run trains on the data its checkpoint recorded, from any working folder, and stops in one
line when that data changed (unless told to accept the change)."""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path

import pytest
import yaml

from yolotrain import train
from yolotrain.checkpoint import CheckpointError
from yolotrain.cli import main
from yolotrain.data import generate_shapes_dataset
from yolotrain.data.fingerprint import ResumeDataWarning
from yolotrain.engine import TrainingError
from yolotrain.engine.trainer import Trainer, find_resume_checkpoint, resume_training
from yolotrain.settings import ConfigError

QUICK = dict(img_size=64, batch_size=4, workers=0, plots=False, autoanchor=False, val=False)


@pytest.fixture(scope="module")
def first_epoch(tmp_path_factory) -> Path:
    """A run started in ``a/`` on the relative ``data/data.yaml``, stopped after epoch 1 of 2 (a finished
    one-epoch run whose saved settings ask for two: what a kill after the first save leaves)."""
    base = tmp_path_factory.mktemp("first")
    shapes = generate_shapes_dataset(root=base / "shapes", n_train=8, n_val=4, img_size=64)
    shutil.copytree(shapes, base / "a" / "data")
    cwd = Path.cwd()
    os.chdir(base / "a")
    try:
        run = train(data="data/data.yaml", epochs=1, project="runs", **QUICK).save_dir
    finally:
        os.chdir(cwd)
    last = base / "a" / run / "weights" / "last.json"
    metadata = json.loads(last.read_text())
    metadata["train_args"]["epochs"] = 2
    last.write_text(json.dumps(metadata))
    return base / "a"


@pytest.fixture
def interrupted(first_epoch, tmp_path) -> Path:
    """A copy of ``first_epoch``'s folder in ``tmp_path/a``, its checkpoint recording the copied data."""
    folder = tmp_path / "a"
    shutil.copytree(first_epoch, folder, symlinks=True)
    last = folder / "runs" / "exp" / "weights" / "last.json"
    metadata = json.loads(last.read_text())
    assert metadata["dataset"]["path"] == str(first_epoch / "data" / "data.yaml")
    metadata["dataset"]["path"] = str(folder / "data" / "data.yaml")
    last.write_text(json.dumps(metadata))
    return folder / "runs" / "exp"


def set_names(root: Path, names: list[str]) -> None:
    config = yaml.safe_load((root / "data.yaml").read_text())
    (root / "data.yaml").write_text(yaml.safe_dump({**config, "names": names, "nc": len(names)}, sort_keys=False))


def prepared(run: Path, **options) -> Trainer:
    """The trainer of ``--resume run`` with its data built and checked (training itself is left out)."""
    trainer = resume_training(find_resume_checkpoint(run), **options)
    trainer.setup()
    return trainer


def test_resume_from_another_folder_trains_on_the_recorded_dataset(interrupted, tmp_path, monkeypatch):
    elsewhere = tmp_path / "b"
    shutil.copytree(interrupted.parents[1] / "data", elsewhere / "data")
    set_names(elsewhere / "data", ["cat", "dog"])  # the same relative path names other data here
    monkeypatch.chdir(elsewhere)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeDataWarning)
        trainer = prepared(interrupted)
    assert trainer.names == ["circle", "rectangle"]
    assert trainer.data_root == str(tmp_path / "a" / "data" / "data.yaml")
    assert trainer.dataset_record["images"] == {"train": 8, "val": 4}


def change_labels(root: Path) -> None:
    label = sorted((root / "labels" / "train").glob("*.txt"))[0]
    label.write_text("1 0.5 0.5 0.25 0.25\n")


def remove_an_image(root: Path) -> None:
    sorted((root / "images" / "train").iterdir())[0].unlink()


@pytest.mark.parametrize("change, message", [
    (lambda root: set_names(root, ["circle", "square"]), "class names 1: 'rectangle' -> 'square'"),
    (remove_an_image, "train images 8 -> 7"),
    (change_labels, "image files or labels differ"),
])
def test_resume_on_changed_data_is_one_line_unless_accepted(interrupted, capsys, change, message):
    change(interrupted.parents[1] / "data")
    capsys.readouterr()
    assert main(["train", "--resume", str(interrupted)]) == 1
    err = capsys.readouterr().err
    assert message in err and "--accept-changed-data" in err and len(err.strip().splitlines()) == 1, err
    with pytest.warns(ResumeDataWarning, match="continuing on it"):
        prepared(interrupted, accept_changed_data=True)


def test_a_changed_class_count_is_refused_even_when_accepted(interrupted):
    set_names(interrupted.parents[1] / "data", ["circle", "rectangle", "star"])
    with pytest.raises(TrainingError, match="2 classes -> 3.*cannot change its number of classes"):
        prepared(interrupted, accept_changed_data=True)


def test_checkpoints_without_a_dataset_record_resume_with_a_warning(interrupted, monkeypatch):
    last = interrupted / "weights" / "last.json"
    metadata = json.loads(last.read_text())
    del metadata["dataset"]
    last.write_text(json.dumps(metadata))
    monkeypatch.chdir(interrupted.parents[1])  # as before records: the saved path from the working folder
    with pytest.warns(ResumeDataWarning, match="without a record of its dataset"):
        prepared(interrupted)


@pytest.mark.parametrize("field, value, message", [
    ("path", 5, "'path' must be a path or null"),
    ("names", "circle", "'names' must be a list of class names"),
    ("images", {"test" * 1000: 3}, "'images' must map train and val to image counts"),
    ("labels_sha256", "x" * 64, "'labels_sha256' must be a SHA-256 digest"),
    (None, [1, 2], "must be a mapping"),
])
def test_a_malformed_dataset_record_is_one_line(interrupted, field, value, message):
    last = interrupted / "weights" / "last.json"
    metadata = json.loads(last.read_text())
    if field is None:
        metadata["dataset"] = value
    else:
        metadata["dataset"][field] = value
    last.write_text(json.dumps(metadata))
    with pytest.raises(CheckpointError, match=f"field 'dataset' {re.escape(message)}$"):
        resume_training(last)


def test_accept_changed_data_only_with_resume(interrupted):
    with pytest.raises(ConfigError, match="only with resume"):
        train(data=str(interrupted.parents[1] / "data" / "data.yaml"), accept_changed_data=True)
