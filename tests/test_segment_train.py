"""Training a segmentation model: the task follows the model, masks reach the loss, results.csv has the mask
columns, a resumed run ends where the whole one ends; the detection path on polygon labels says so."""

from __future__ import annotations

import csv
from pathlib import Path

import cv2
import pytest
import torch
from safetensors.torch import load_file
from test_train import run_cli

from yolotrain import Yolov5, train
from yolotrain.checkpoint import save_checkpoint
from yolotrain.data import generate_shapes_dataset
from yolotrain.draw import draw_batch
from yolotrain.engine import Trainer, resolve_config
from yolotrain.interop import load_checkpoint

TINY = {"img_size": 64, "batch_size": 4, "workers": 0, "device": "cpu", "autoanchor": False}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=8, n_val=4, img_size=64) / \
        "data.yaml"


def results(run: Path) -> list[dict[str, str]]:
    with (run / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_segmentation_model_trains_on_masks_and_reports_them(shapes, tmp_path):
    seen = {}

    def record(trainer, epoch, batch):
        seen.setdefault("criterion", type(trainer.criterion).__name__)
        seen.setdefault("parts", trainer.criterion.components.tolist())

    result = train(data=str(shapes), model="yolov5n-seg", epochs=2, project=str(tmp_path), val=False,
                   callbacks={"on_train_batch_end": lambda trainer, epoch, batch, *rest: record(trainer, epoch, batch)},
                   **TINY)
    assert seen["criterion"] == "SegmentLoss" and len(seen["parts"]) == 4 and seen["parts"][1] > 0
    rows = results(result.save_dir)
    assert list(rows[0])[:5] == ["epoch", "train_box", "train_seg", "train_obj", "train_cls"]
    assert {"mask_precision", "mask_mAP50", "mask_mAP50-95", "val_seg"} <= set(rows[0])
    assert rows[0]["mask_mAP50"] == "" and rows[1]["mask_mAP50"] != ""  # validated in the last epoch only
    assert float(rows[1]["train_seg"]) > 0 and float(rows[1]["val_seg"]) > 0
    model, meta = load_checkpoint(result.last)
    assert (model.task, model.version, meta["names"]) == ("segment", "n-seg", ["circle", "rectangle"])


@pytest.mark.slow
def test_resumed_segmentation_run_ends_where_the_whole_run_ends(shapes, tmp_path):
    """Bit-exact, copy-paste and all (three short runs: a slow test)."""
    settings = dict(data=str(shapes), model="yolov5n-seg", epochs=2, val=False, copy_paste=0.5, **TINY)
    whole = train(project=str(tmp_path / "whole"), **settings)

    def stop_after_first_epoch(trainer, epoch, *rest):
        trainer.stop = True

    cut = train(project=str(tmp_path / "cut"), callbacks={"on_fit_epoch_end": stop_after_first_epoch}, **settings)
    assert cut.epochs_run == 1
    resumed = train(resume=str(cut.last))
    assert resumed.epochs_run == 1
    a, b = load_file(f"{whole.last}.safetensors"), load_file(f"{resumed.last}.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert results(whole.save_dir)[-1]["train_seg"] == results(resumed.save_dir)[-1]["train_seg"]


def test_detection_model_on_polygon_labels_trains_boxes_and_says_so(shapes, tmp_path):
    run = run_cli("train", "--data", str(shapes), "--epochs", "1", "--img", "64", "--batch", "4", "--workers",
                  "0", "--no-val", "--noautoanchor", "--copy-paste", "0.3", "--project", "runs", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = run.stdout + run.stderr
    assert "Data: polygon labels, trained as their boxes by this detection model" in out
    assert "copy_paste 0.3 is left out" in out
    assert list(results(tmp_path / "runs" / "exp")[0])[:4] == ["epoch", "train_box", "train_obj", "train_cls"]


def test_segmentation_model_on_box_labels_is_one_line(coco_mini, tmp_path):
    run = run_cli("train", "--data", str(coco_mini), "--model", "yolov5n-seg", "--epochs", "1", "--img", "64",
                  "--batch", "2", "--workers", "0", "--project", "runs", cwd=tmp_path)
    assert run.returncode == 1
    assert run.stderr.startswith("yolotrain train: error: ") and len(run.stderr.strip().splitlines()) == 1
    assert "train split has no polygon labels" in run.stderr


def test_detection_weights_start_a_segmentation_model(shapes, tmp_path, capsys):
    """``--cfg yolov5n-seg.yaml --weights det``: the backbone, neck, anchors and the head's box, objectness
    and class outputs come from the detection checkpoint; the mask coefficients and Proto start fresh."""
    torch.manual_seed(3)
    detector = Yolov5("n", num_classes=2, names=["circle", "rectangle"])
    save_checkpoint(tmp_path / "detector", detector)
    trainer = Trainer(resolve_config(data=str(shapes), model="yolov5n-seg", pretrained=str(tmp_path / "detector"),
                                     project=str(tmp_path / "runs"), epochs=1, **TINY))
    trainer.setup()
    ours, theirs = trainer.model.state_dict(), detector.state_dict()
    assert trainer.model.task == "segment"
    assert all(torch.equal(ours[k], v) for k, v in theirs.items() if not k.startswith("model.24.m."))
    assert torch.equal(ours["model.24.m.0.bias"].view(3, -1)[:, :7], theirs["model.24.m.0.bias"].view(3, 7))
    assert f"Transferred {len(ours) - len([k for k in ours if '.proto.' in k])}/{len(ours)} tensors from" in \
        capsys.readouterr().out


def test_the_first_training_batches_are_drawn_with_their_masks(shapes, tmp_path):
    """train_batch0.jpg of a segmentation run is the batch the model saw with its boxes and its target masks
    blended in: it differs from the same batch drawn with boxes only wherever a mask lies."""
    batches = []
    result = train(data=str(shapes), model="yolov5n-seg", epochs=1, project=str(tmp_path), val=False,
                   callbacks={"on_train_batch_end": lambda trainer, epoch, batch, imgs, targets, loss:
                              batches.append((imgs.clone(), targets.clone()))},
                   **TINY)
    drawn = [result.save_dir / f"train_batch{i}.jpg" for i in range(len(batches))]
    assert len(batches) == 2 and all(path.is_file() for path in drawn)
    imgs, targets = batches[0]
    picture = cv2.imread(str(drawn[0]))
    boxes_only = draw_batch(imgs, targets, ["circle", "rectangle"])
    assert picture.shape == boxes_only.shape == (2 * 64, 2 * 64, 3)
    # Blurred, JPEG's colour noise at sharp edges averages out; a blended mask is a shift over a whole region.
    smooth = [cv2.GaussianBlur(p, (7, 7), 0).astype(int) for p in (picture, boxes_only)]
    tinted = (abs(smooth[0] - smooth[1]).max(2) > 25).mean()
    assert tinted > 0.03, f"only {tinted:.1%} of the pixels differ from the boxes-only drawing"
