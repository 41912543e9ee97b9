"""The reference's training options, each shown by its effect: freeze, save period, patience, single class,
multi-scale, caching, and the learning rates results.csv reports."""

from __future__ import annotations

import csv
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from yolotrain import YoloLoss, train
from yolotrain.checkpoint import read_checkpoint
from yolotrain.data.dataset import DetectionDataset
from yolotrain.data.loaders import DataConfig, build_loaders
from yolotrain.data.verify import DataWarning

QUICK = dict(img_size=64, batch_size=4, workers=0, plots=False, autoanchor=False)


def results(run: Path) -> list[dict[str, str]]:
    with (run / "results.csv").open() as f:
        return list(csv.DictReader(f))


class RecordingLoss:
    """The default loss, keeping the model, its starting parameters and the size of every batch."""

    def __init__(self, record: dict, model, rect_training: bool) -> None:
        record.update(model=model, start={k: v.detach().clone() for k, v in model.named_parameters()}, sizes=[])
        self.record = record
        self.criterion = YoloLoss(model, rect_training)

    def __call__(self, outputs, targets, pred_size):
        self.record["sizes"].append(tuple(int(s) for s in pred_size))
        return self.criterion(outputs, targets, pred_size=pred_size)

    @property
    def components(self) -> torch.Tensor:
        return self.criterion.components


def recording_loss(record: dict):
    return lambda model, rect_training: RecordingLoss(record, model, rect_training)


def test_freeze_backbone_save_period_and_warmup_learning_rates(tiny_data, tmp_path):
    record: dict = {}
    run = train(loss=recording_loss(record), data=str(tiny_data), epochs=2, val=False, freeze=(10,), save_period=1,
                project=str(tmp_path), **QUICK)
    model = record["model"]
    trained = read_checkpoint(run.last).model_state
    for name, start in record["start"].items():
        layer = int(name.split(".")[1])
        if layer < 10:  # the backbone: no gradient, bit-equal after training
            assert not dict(model.named_parameters())[name].requires_grad
            assert dict(model.named_parameters())[name].grad is None
            assert torch.equal(trained[name], start), name
    changed = [n for n, start in record["start"].items() if int(n.split(".")[1]) >= 10
               and not torch.equal(trained[n], start)]
    assert changed  # the rest trains
    # --save-period 1: one checkpoint per epoch, numbered from 0 as the reference numbers them.
    for epoch in (0, 1):
        meta = json.loads((run.save_dir / "weights" / f"epoch{epoch}.json").read_text())
        assert meta["epoch"] == epoch
    # results.csv: the rates of the epoch's last step, inside warm-up (100 steps), not the scheduled lr0.
    rows = results(run.save_dir)
    warmup = 100
    for epoch, row in enumerate(rows):
        step = 2 * epoch + 1  # two batches per epoch
        factor = 1 - epoch / 2 * 0.99  # the linear schedule of this epoch
        assert float(row["lr0"]) == pytest.approx(np.interp(step, [0, warmup], [0.1, 0.01 * factor]), rel=1e-4)
        assert float(row["lr1"]) == pytest.approx(np.interp(step, [0, warmup], [0.0, 0.01 * factor]), rel=1e-4)


def test_freeze_a_list_single_class_and_multi_scale(tmp_path, coco_mini):
    record: dict = {}
    run = train(loss=recording_loss(record), data=str(coco_mini), epochs=2, freeze=(0, 2), single_cls=True,
                multi_scale=True, warmup_epochs=0, batch_size=2, nominal_batch=2, project=str(tmp_path),
                **{k: v for k, v in QUICK.items() if k != "batch_size"})
    trained = read_checkpoint(run.last).model_state
    layers_changed = {int(n.split(".")[1]) for n, start in record["start"].items()
                      if not torch.equal(trained[n], start)}
    assert 0 not in layers_changed and 2 not in layers_changed and 1 in layers_changed
    # One class, named as the reference names it, in training and in validation.
    meta = json.loads(run.last.with_suffix(".json").read_text())
    assert meta["nc"] == 1 and meta["names"] == ["item"] and "mAP50" in meta["metrics"]
    # Multi-scale: batch sizes are multiples of 32 within 0.5-1.5x of 64, and not all the same.
    sizes = record["sizes"]
    assert all(h == w and h % 32 == 0 and 32 <= h <= 96 for h, w in sizes)
    assert len(set(sizes)) > 1


def test_single_class_loaders(coco_mini):
    loaders = build_loaders(DataConfig(path=str(coco_mini), img_size=64, batch_size=6, workers=0,
                                       single_cls=True))
    assert loaders.names == ["item"]
    for loader in (loaders.train, loaders.val):
        _, targets = next(iter(loader))
        assert targets.shape[0] > 0 and (targets[:, 1] == 0).all()
    plain = build_loaders(DataConfig(path=str(coco_mini), img_size=64, batch_size=6, workers=0))
    assert (next(iter(plain.val)).targets[:, 1] > 0).any()


def test_patience_stops_a_run_without_gains(tiny_data, tmp_path, capsys):
    run = train(data=str(tiny_data), epochs=12, patience=2, lr0=1e-9, warmup_epochs=0, project=str(tmp_path),
                **QUICK)
    out = capsys.readouterr().out
    assert "Stopping early" in out and "--patience 2" in out
    assert run.epochs_run < 12
    assert len(results(run.save_dir)) == run.epochs_run
    assert json.loads(run.last.with_suffix(".json").read_text())["epoch"] == run.epochs_run - 1


def copy_dataset(tmp_path: Path, tiny_data: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(tiny_data.parent, root)
    for cache in root.rglob("*.cache"):
        cache.unlink()
    return root / "data.yaml"


def test_disk_cache_writes_arrays_beside_the_images_and_gives_the_same_batches(tiny_data, tmp_path):
    data = copy_dataset(tmp_path, tiny_data)
    config = DataConfig(path=str(data), img_size=64, batch_size=4, workers=0, cache_mb=0)  # no memory cache
    plain = next(iter(build_loaders(config, splits=("val",)).val))
    cached = build_loaders(DataConfig(**{**vars(config), "cache": "disk"}), splits=("val",)).val
    images = sorted(p for p in (data.parent / "images" / "val").iterdir() if p.suffix != ".npy")
    assert images and all(len(list(p.parent.glob(f"{p.name}.*.npy"))) == 1 for p in images)
    for a, b in zip(plain, next(iter(cached))):
        assert torch.equal(a, b)
    # The arrays are what is read: the images themselves are no longer needed.
    for p in images:
        p.write_bytes(b"")
    assert torch.equal(next(iter(cached)).imgs, plain.imgs)


def test_disk_cache_of_a_read_only_folder_goes_to_the_cache_folder(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    data = copy_dataset(tmp_path, tiny_data)
    folder = data.parent / "images" / "val"
    folder.chmod(0o555)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            build_loaders(DataConfig(path=str(data), img_size=64, batch_size=4, workers=0, cache="disk"),
                          splits=("val",))
    finally:
        folder.chmod(0o755)
    assert not list(folder.glob("*.npy"))
    assert len(list((tmp_path / "cache" / "images").rglob("*.npy"))) == len(list(folder.iterdir()))
    messages = [str(w.message) for w in caught if issubclass(w.category, DataWarning)]
    assert any("read-only" in m and str(folder) in m for m in messages)


def test_ram_cache_holds_every_image_before_training(tiny_data, tmp_path):
    data = copy_dataset(tmp_path, tiny_data)
    loaders = build_loaders(DataConfig(path=str(data), img_size=64, batch_size=4, workers=0, cache="ram"),
                            splits=("val",))
    dataset: DetectionDataset = loaders.val.dataset
    before = next(iter(loaders.val))
    for p in dataset.im_files:
        p.unlink()  # decoded already: nothing is read from disk any more
    after = next(iter(loaders.val))
    assert torch.equal(before.imgs, after.imgs)


def test_a_reference_train_command_line_resolves(tmp_path):
    """The options of the reference's train.py that yolotrain has, spelled as the reference spells them."""
    from yolotrain.cli import build_parser, train_settings
    from yolotrain.engine.config import resolve_config

    hyp = tmp_path / "hyp.yaml"
    hyp.write_text("lr0: 0.02\nfl_gamma: 1.5\n")
    argv = ["--weights", "yolov5s.pt", "--data", "data.yaml", "--hyp", str(hyp), "--epochs", "3", "--batch-size", "8",
            "--imgsz", "320", "--rect", "--noval", "--noautoanchor", "--noplots", "--cache", "--device", "cpu",
            "--multi-scale", "--single-cls", "--optimizer", "AdamW", "--sync-bn", "--workers", "1", "--project", "p",
            "--name", "n", "--exist-ok", "--cos-lr", "--label-smoothing", "0.1", "--patience", "7", "--freeze", "0",
            "1", "2", "--save-period", "2", "--seed", "3"]
    args = build_parser().parse_args(["train", *argv])
    c = resolve_config(args.config, hyp=args.hyp, **train_settings(args))
    assert (c.model, c.data.path, c.epochs, c.data.batch_size, c.data.img_size, c.data.rect) == \
        ("yolov5s.pt", "data.yaml", 3, 8, 320, True)
    assert (c.eval.val, c.autoanchor, c.eval.plots, c.data.cache, c.data.multi_scale, c.data.single_cls) == \
        (False, False, False, "ram", True, True)
    assert (c.optim.optimizer, c.sync_bn, c.data.workers, c.project, c.name, c.exist_ok, c.optim.cos_lr) == \
        ("AdamW", True, 1, "p", "n", True, True)
    assert (c.loss.label_smoothing, c.patience, c.freeze, c.save_period, c.seed) == (0.1, 7, (0, 1, 2), 2, 3)
    assert (c.optim.lr0, c.loss.fl_gamma) == (0.02, 1.5)


def test_a_bare_architecture_says_it_starts_from_scratch(tiny_data, tmp_path, capsys):
    train(data=str(tiny_data), model="yolov5n", epochs=1, val=False, project=str(tmp_path), **QUICK)
    precision, first = capsys.readouterr().out.splitlines()[:2]  # the precision line opens every run
    assert precision.startswith("Precision: ")
    assert "yolov5n: random initial weights (training from scratch)" in first and "yolov5n.pt" in first
