"""Training a classifier through the engine: the task follows the model and the data, the reference's
classify recipe, results.csv with loss and accuracy columns, checkpoints that rebuild the classifier, a
resumed run that ends where the whole one ends, one-line refusals of the wrong data."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train import run_cli

import yolotrain
from yolotrain import Yolov5, train
from yolotrain.checkpoint import CheckpointError, save_checkpoint
from yolotrain.data import generate_shapes_dataset
from yolotrain.data.classify import write_shape_crops
from yolotrain.engine import Trainer, resolve_config
from yolotrain.interop import load_checkpoint
from yolotrain.loss import ClassifyLoss
from yolotrain.model.classify import Classifier
from yolotrain.settings import ConfigError

TINY = {"img_size": 32, "batch_size": 8, "workers": 0, "device": "cpu"}


@pytest.fixture(scope="module")
def crops(tmp_path_factory) -> Path:
    return write_shape_crops(tmp_path_factory.mktemp("crops") / "shapes-cls", n_train=6, n_val=3)


def results(run: Path) -> list[dict[str, str]]:
    with (run / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_classifier_trains_on_class_folders_with_the_reference_recipe(crops, tmp_path):
    seen: dict = {}

    def batch_end(trainer, epoch, batch, imgs, targets, loss):
        seen.setdefault("criterion", trainer.criterion)
        seen.setdefault("optimizer", type(trainer.optimizer).__name__)
        seen.setdefault("targets", targets)

    def fit_epoch_end(trainer, epoch, row, score):
        seen["row"], seen["score"] = row, score

    result = train(data=str(crops), model="yolov5n-cls", epochs=1, project=str(tmp_path), plots=False,
                   callbacks={"on_train_batch_end": batch_end, "on_fit_epoch_end": fit_epoch_end}, **TINY)
    assert isinstance(seen["criterion"], ClassifyLoss) and seen["criterion"].label_smoothing == 0.1
    assert seen["optimizer"] == "Adam" and seen["targets"].dtype == torch.int64
    rows = results(result.save_dir)
    assert list(rows[0])[:5] == ["epoch", "train_loss", "top1", "top5", "val_loss"]
    assert float(rows[0]["train_loss"]) > 0 and float(rows[0]["val_loss"]) > 0
    assert float(rows[0]["top1"]) == pytest.approx(seen["score"]) == pytest.approx(result.metrics["top1"])
    assert float(rows[0]["lr0"]) == 0.001  # Adam's lr0, no warm-up
    model, meta = load_checkpoint(result.best)
    assert isinstance(model, Classifier) and (model.arch, model.cutoff, meta["names"]) == \
        ("yolov5n-cls", 10, ["circle", "rectangle"])
    again = yolotrain.val(str(result.best), str(crops), img_size=32, verbose=False, plots=False)
    assert again.top1 == pytest.approx(result.metrics["top1"])


def test_the_classify_recipe_fills_what_was_not_given(crops):
    config = resolve_config(model="yolov5n-cls", data=str(crops))
    assert (config.task, config.optim.optimizer, config.optim.lr0, config.optim.momentum, config.optim.weight_decay,
            config.optim.warmup_epochs, config.loss.label_smoothing) == ("classify", "Adam", 0.001, 0.9, 5e-5, 0.0, 0.1)
    assert (config.data.img_size, config.epochs, config.data.batch_size, config.optim.nominal_batch) == \
        (224, 10, 64, 64)
    given = resolve_config(model="yolov5s.pt", data=str(crops), label_smoothing=0.0, momentum=0.95, batch_size=16)
    assert (given.task, given.loss.label_smoothing, given.optim.momentum, given.optim.nominal_batch) == \
        ("classify", 0.0, 0.95, 16)
    detection = resolve_config(model="yolov5n")
    assert (detection.task, detection.optim.momentum, detection.loss.label_smoothing) == ("detect", 0.937, 0.0)


def test_detector_weights_are_cut_into_a_classifier(crops, tmp_path):
    """``--model det`` on class folders: the detector's first layers (its tensors) and a fresh Classify head,
    cut at ``--cutoff``, every Dropout at ``--dropout``; the checkpoint rebuilds the same cut."""
    torch.manual_seed(1)
    detector = Yolov5("n", num_classes=3)
    save_checkpoint(tmp_path / "detector", detector)
    trainer = Trainer(resolve_config(data=str(crops), model=str(tmp_path / "detector.json"), cutoff=8, dropout=0.2,
                                     project=str(tmp_path / "runs"), epochs=1, **TINY))
    trainer.setup()
    model = trainer.model
    assert isinstance(model, Classifier) and (model.arch, model.cutoff, model.num_classes) == ("yolov5n-cls", 8, 2)
    ours, theirs = model.state_dict(), detector.state_dict()
    kept = [k for k in theirs if int(k.split(".")[1]) < 7]
    assert kept and all(torch.equal(ours[k], theirs[k]) for k in kept)
    assert model.model[7].drop.p == 0.2
    save_checkpoint(tmp_path / "cut", model)
    rebuilt, _ = load_checkpoint(tmp_path / "cut")
    assert rebuilt.cutoff == 8 and all(torch.equal(v, rebuilt.state_dict()[k]) for k, v in ours.items())


@pytest.mark.slow
def test_a_torchvision_model_trains_by_name(crops, tmp_path):
    result = train(data=str(crops), model="resnet18", epochs=1, project=str(tmp_path), plots=False, **TINY)
    model = yolotrain.load(result.last)
    assert isinstance(model, Classifier) and model.arch == "resnet18" and model.num_classes == 2


@pytest.mark.parametrize("name", ["yolov8n-cls", "yolo11n-cls"])
def test_an_anchor_free_family_classifier_trains_by_name_with_the_classify_recipe(crops, tmp_path, name):
    assert resolve_config(model=name, data=str(crops)).task == "classify"
    result = train(data=str(crops), model=name, epochs=1, project=str(tmp_path), plots=False, **TINY)
    model = yolotrain.load(result.last)
    assert isinstance(model, Classifier) and model.arch == name and model.num_classes == 2
    assert model.names == ["circle", "rectangle"]


def test_a_classifier_on_detection_data_is_one_line(tmp_path):
    shapes = generate_shapes_dataset(root=tmp_path / "shapes", n_train=2, n_val=2, img_size=64) / "data.yaml"
    run = run_cli("train", "--data", str(shapes), "--model", "yolov5n-cls", "--epochs", "1", "--workers", "0",
                  "--project", "runs", cwd=tmp_path)
    assert run.returncode == 1
    assert run.stderr.startswith("yolotrain train: error: ") and len(run.stderr.strip().splitlines()) == 1
    assert "yolov5n-cls is a classifier: --data must be a folder of class folders" in run.stderr
    classifier = Classifier.from_name("yolov5n-cls", 2)
    save_checkpoint(tmp_path / "classifier", classifier)
    trainer = Trainer(resolve_config(data=str(shapes), model=str(tmp_path / "classifier.json"), epochs=1,
                                     project=str(tmp_path / "runs"), img_size=64, batch_size=2, workers=0))
    with pytest.raises(ConfigError, match="classifier: --data must be a folder of class folders"):
        trainer.setup()


def test_a_classifier_checkpoint_with_a_bad_architecture_is_one_line(tmp_path):
    path = save_checkpoint(tmp_path / "c", Classifier.from_name("yolov5n-cls", 2))
    path.write_text(path.read_text().replace('"cutoff": 10', '"cutoff": "ten"'))
    with pytest.raises(CheckpointError, match="field 'cutoff' must be null or an integer"):
        load_checkpoint(tmp_path / "c")


def test_the_doctor_finds_no_inplace_write_in_a_classification_step():
    from yolotrain.doctor import check_step

    torch.manual_seed(0)
    model = Classifier.from_name("yolov5n-cls", 3).train()
    criterion = ClassifyLoss(0.1)

    def step():
        criterion(model(torch.rand(2, 3, 32, 32)), torch.tensor([0, 2])).backward()

    assert check_step(step) == []


@pytest.mark.slow
def test_resumed_classifier_run_ends_where_the_whole_run_ends(crops, tmp_path):
    settings = dict(data=str(crops), model="yolov5n-cls", epochs=2, plots=False, **TINY)
    whole = train(project=str(tmp_path / "whole"), **settings)

    def stop_after_first_epoch(trainer, epoch, *rest):
        trainer.stop = True

    cut = train(project=str(tmp_path / "cut"), callbacks={"on_fit_epoch_end": stop_after_first_epoch}, **settings)
    assert cut.epochs_run == 1
    resumed = train(resume=str(cut.last))
    assert resumed.epochs_run == 1
    a, b = load_file(f"{whole.last}.safetensors"), load_file(f"{resumed.last}.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert results(whole.save_dir)[-1] == results(resumed.save_dir)[-1]
