"""The oriented-box task end to end: ``train --model yolov8n-obb`` on rotated labels (results.csv's rotated box
metrics and angle loss, checkpoints that load and resume), val through the rotated NMS and ProbIoU scoring with
DOTA-style label files, rbox/poly json and rotated pictures, predict's rotated results, sliced prediction, and
exports whose val and predict score as PyTorch's."""

from __future__ import annotations

import copy
import csv
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import untrained

from yolotrain import YOLO, predict, train, val
from yolotrain.cli import main
from yolotrain.data import generate_shapes_dataset
from yolotrain.data.loaders import DataConfig
from yolotrain.engine.config import TrainConfig
from yolotrain.eval.obb import RotatedDetectionStats
from yolotrain.model.anchor_free import AnchorFreeYolo
from yolotrain.rotated import xywhr_to_corners
from yolotrain.task import get_task, task_of

SIZE = 64
SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=8, n_val=6, img_size=SIZE,
                                   labels="obb")


@pytest.fixture(scope="module")
def model() -> AnchorFreeYolo:
    return untrained("yolov8n-obb")


@pytest.fixture(scope="module")
def trained(shapes, tmp_path_factory):
    """A two-epoch run stopped after its first epoch (which the resume test finishes)."""
    def stop_after_first_epoch(trainer, epoch, *rest):
        trainer.stop = True

    return train(model="yolov8n-obb", data=str(shapes / "data.yaml"), epochs=2, img_size=SIZE, batch_size=4,
                 project=str(tmp_path_factory.mktemp("runs")), name="obb", device="cpu", workers=0,
                 callbacks={"on_fit_epoch_end": stop_after_first_epoch})


def test_obb_models_and_runs_take_the_obb_task():
    task = get_task("obb")
    assert task.name == "obb" and task.dataset_kind == "rotated"
    assert task_of(AnchorFreeYolo("yolov8n-obb", num_classes=2)) is task
    assert TrainConfig(model="yolov8n-obb").task == "obb" and TrainConfig(model="yolo11s-obb.pt").task == "obb"
    # A dataset's YAML cannot say its labels are rotated: without an -obb model a run is detection's.
    assert TrainConfig(data=DataConfig(path="dota8.yaml")).task == "detect"
    assert YOLO("yolov8n-obb").task == "obb"


def test_training_writes_rotated_metrics_and_the_angle_loss(trained):
    with open(trained.save_dir / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [k for k in rows[0] if k.startswith(("train_", "val_"))] == [
        "train_box", "train_cls", "train_dfl", "train_angle", "val_box", "val_cls", "val_dfl", "val_angle"]
    assert all(math.isfinite(float(rows[-1][k])) for k in ("mAP50", "mAP50-95", "val_angle"))
    assert (trained.save_dir / "train_batch0.jpg").is_file()


@pytest.mark.slow
def test_a_checkpoint_loads_as_an_obb_model_and_resumes(trained):
    loaded = YOLO(str(trained.last))
    assert loaded.task == "obb"
    resumed = train(resume=str(trained.last), device="cpu", workers=0)
    assert resumed.epochs_run == 1
    with open(resumed.save_dir / "results.csv", newline="") as f:
        assert [int(row["epoch"]) for row in csv.DictReader(f)] == [1, 2]


@pytest.mark.slow
def test_a_resumed_obb_run_ends_where_the_whole_run_ends(shapes, tmp_path):
    """Bit for bit: the weights and the angle loss of a run cut after its first epoch and resumed equal those of
    the same run made in one go."""
    from safetensors.torch import load_file

    settings = dict(model="yolov8n-obb", data=str(shapes / "data.yaml"), epochs=2, img_size=SIZE, batch_size=4,
                    device="cpu", workers=0, val=False)
    whole = train(project=str(tmp_path / "whole"), **settings)

    def stop_after_first_epoch(trainer, epoch, *rest):
        trainer.stop = True

    cut = train(project=str(tmp_path / "cut"), callbacks={"on_fit_epoch_end": stop_after_first_epoch}, **settings)
    resumed = train(resume=str(cut.last))
    a, b = load_file(f"{whole.last}.safetensors"), load_file(f"{resumed.last}.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    last_rows = []
    for run in (whole, resumed):
        with open(run.save_dir / "results.csv", newline="") as f:
            last_rows.append(list(csv.DictReader(f))[-1])
    assert last_rows[0]["train_angle"] == last_rows[1]["train_angle"]


def test_the_command_line_trains_an_obb_model(shapes, tmp_path):
    assert main(["train", "--model", "yolov8n-obb", "--data", str(shapes / "data.yaml"), "--epochs", "1",
                 "--img", str(SIZE), "--batch", "4", "--workers", "0", "--device", "cpu", "--noplots",
                 "--project", str(tmp_path), "--name", "cli"]) == 0
    header = (tmp_path / "cli" / "results.csv").read_text().splitlines()[0]
    assert header.split(",")[-7:-3] == ["val_box", "val_cls", "val_dfl", "val_angle"]


def test_rotated_boxes_move_to_original_pixels_with_their_angle_kept():
    task = get_task("obb")
    rows = torch.tensor([[30.0, 20.0, 10.0, 4.0, 0.9, 1.0, 0.7]])
    native = task.original_boxes(rows, (0.5, 0.5), (4.0, 2.0), (100, 100))
    torch.testing.assert_close(native, torch.tensor([[52.0, 36.0, 20.0, 8.0, 0.9, 1.0, 0.7]]))
    labels = task.label_boxes(torch.tensor([[0.5, 0.25, 0.1, 0.2, 0.3]]), (40, 80))
    torch.testing.assert_close(labels, torch.tensor([[40.0, 10.0, 8.0, 8.0, 0.3]]))


def test_val_scores_by_probiou_and_writes_dota_rows_and_rbox_json(model, shapes, tmp_path):
    metrics = val(model, str(shapes / "data.yaml"), img_size=SIZE, batch_size=3, workers=0, verbose=False,
                  half=False, conf=0.01, save_dir=tmp_path, save_txt=True, save_conf=True, save_json=True)
    assert 0 <= metrics.map <= metrics.map50 <= 1
    rows = [line.split() for f in sorted((tmp_path / "labels").glob("*.txt")) for line in f.read_text().splitlines()]
    assert rows and all(len(row) == 10 for row in rows)  # class, 4 corners, confidence
    entries = json.loads((tmp_path / "predictions.json").read_text())
    assert len(entries) == len(rows)
    first = entries[0]
    assert len(first["rbox"]) == 5 and len(first["poly"]) == 8
    corners = xywhr_to_corners(torch.tensor([first["rbox"]], dtype=torch.float64)).reshape(-1)
    np.testing.assert_allclose(corners.numpy(), first["poly"], atol=0.01)
    assert (tmp_path / "val_batch0_labels.jpg").is_file() and (tmp_path / "val_batch0_pred.jpg").is_file()
    assert not (tmp_path / "confusion_matrix.png").exists()  # left out for rotated boxes


def test_val_metrics_equal_rotated_stats_of_the_same_detections(model, shapes):
    """val's mAP is RotatedDetectionStats over the rotated NMS's detections and the xywhr labels, in the batch's
    pixels (Ultralytics' rules): recomputed here image by image."""
    from yolotrain.eval.val import build_val_loader

    metrics = val(model, str(shapes / "data.yaml"), img_size=SIZE, batch_size=6, workers=0, verbose=False,
                  half=False, plots=False, rect=False)
    loader = build_val_loader(shapes / "data.yaml", 2, SIZE, 6, rect=False, workers=0, kind="rotated")
    task = get_task("obb")
    stats = RotatedDetectionStats(2)
    fused = copy.deepcopy(model).fuse()
    for batch in loader:
        with torch.no_grad():
            dets = task.suppress(fused(batch.imgs.float() / 255), 0.001, 0.7, multi_label=True, max_det=300)
        for i, det in enumerate(dets):
            rows = batch.targets[batch.targets[:, 0] == i]
            stats.update(det, task.label_boxes(rows[:, 2:], (SIZE, SIZE)), rows[:, 1])
    expected = stats.compute(["circle", "rectangle"])
    assert metrics.map50 == pytest.approx(expected.map50, abs=1e-6) and metrics.map == pytest.approx(expected.map,
                                                                                                        abs=1e-6)


def test_predict_results_carry_rotated_boxes_and_their_corners(model, shapes, tmp_path):
    images = sorted((shapes / "images" / "val").iterdir())[:2]
    results = predict(model, images, img_size=SIZE, conf=0.3, half=False, save_dir=tmp_path, save_txt=True)
    assert sum(len(r.scores) for r in results) > 0
    for result in results:
        assert result.rotated.shape == (len(result.scores), 5)
        corners = xywhr_to_corners(result.rotated)
        torch.testing.assert_close(torch.as_tensor(np.stack(result.polygons)) if result.polygons else corners,
                                   corners.float())
        torch.testing.assert_close(result.boxes.xyxy, torch.cat((corners.amin(1), corners.amax(1)), 1))
        assert result.plot().shape == (*result.orig_shape, 3)
    rows = (tmp_path / "labels" / f"{images[0].stem}.txt").read_text().splitlines()
    assert all(len(row.split()) == 10 for row in rows)
    saved = json.loads((tmp_path / "predictions.json").read_text())
    assert all(len(d["rbox"]) == 5 and len(d["polygon"]) == 8 for entry in saved for d in entry["detections"])


def test_sliced_prediction_with_one_tile_equals_the_whole_image(model, shapes):
    images = sorted((shapes / "images" / "val").iterdir())[:2]
    whole = predict(model, images, img_size=SIZE, conf=0.3, half=False)
    tiled = predict(model, images, img_size=SIZE, conf=0.3, half=False, slice=SIZE)
    for a, b in zip(whole, tiled):
        assert len(a.scores) == len(b.scores)
        torch.testing.assert_close(b.rotated, a.rotated, atol=1e-3, rtol=1e-5)


def test_sliced_validation_with_one_tile_scores_and_writes_what_whole_images_do(model, shapes, tmp_path):
    """val --slice runs the oriented-box model tile by tile and merges with the rotated NMS: with one tile per image
    the rotated detections written and the scores are the whole image's."""
    options = dict(img_size=SIZE, batch_size=3, workers=0, verbose=False, half=False, conf=0.01, rect=False,
                   plots=False, save_json=True)
    whole = val(model, str(shapes / "data.yaml"), save_dir=tmp_path / "whole", **options)
    tiled = val(model, str(shapes / "data.yaml"), save_dir=tmp_path / "tiled", slice=SIZE, **options)
    assert (tiled.map50, tiled.map) == pytest.approx((whole.map50, whole.map), abs=1e-6)
    expected = json.loads((tmp_path / "whole" / "predictions.json").read_text())
    found = json.loads((tmp_path / "tiled" / "predictions.json").read_text())
    assert len(found) == len(expected) > 0
    for a, b in zip(found, expected):
        assert (a["image_id"], a["category_id"]) == (b["image_id"], b["category_id"])
        np.testing.assert_allclose(a["rbox"] + [a["score"]], b["rbox"] + [b["score"]], atol=1e-3)


def test_tracking_and_options_without_rotated_meaning_are_refused_in_one_line(model, shapes, tmp_path):
    task = get_task("obb")
    assert "rotated boxes" in task.track_refusal("yolov8n-obb")
    from yolotrain.track import track

    image = next((shapes / "images" / "val").iterdir())
    with pytest.raises(ValueError, match=r"^[^\n]*rotated boxes[^\n]*$"):
        track(model, image, save_dir=tmp_path / "track")
    assert not (tmp_path / "track").exists()
    from yolotrain.interop import export

    for option in ("raw", "nms", "int8"):
        with pytest.raises(ValueError, match=r"^[^\n]+$"):
            export(model, "onnx", out=tmp_path / f"{option}.onnx", img_size=SIZE, **{option: True})


EXPORTS = ["onnx", pytest.param("openvino", marks=pytest.mark.skipif(importlib.util.find_spec("openvino") is None,
                                                                     reason="pip install 'yolotrain[openvino]'")),
           "torchscript"]


@pytest.mark.parametrize("fmt", EXPORTS)
def test_exports_give_the_decoded_rotated_predictions_of_pytorch(model, tmp_path, fmt):
    pytest.importorskip("onnxruntime", reason="needs the export extra: pip install 'yolotrain[export]'")
    from yolotrain.interop import export, load_exported

    suffix = {"onnx": ".onnx", "openvino": ".xml", "torchscript": ".torchscript"}[fmt]
    export(model, fmt, out=tmp_path / f"obb{suffix}", img_size=SIZE, dynamic_size=fmt != "torchscript")
    runtime = load_exported(tmp_path / f"obb{suffix}", trust_code=True)
    assert runtime.task == "obb" and runtime.names == model.names
    imgs = torch.rand(2, 3, SIZE, SIZE)
    with torch.no_grad():
        expected = copy.deepcopy(model).fuse()(imgs)
    actual = runtime(imgs)
    assert actual.shape == expected.shape == (2, expected.shape[1], 5 + 2 + 1)
    torch.testing.assert_close(actual[..., 4:], expected[..., 4:], atol=1e-4, rtol=0)
    torch.testing.assert_close(actual[..., :4], expected[..., :4], atol=1e-3, rtol=1e-5)


def test_val_and_predict_on_an_onnx_export_score_as_pytorch(model, shapes, tmp_path):
    pytest.importorskip("onnxruntime", reason="needs the export extra: pip install 'yolotrain[export]'")
    from yolotrain.interop import export

    path = tmp_path / "obb.onnx"
    export(model, "onnx", out=path, img_size=SIZE, dynamic_size=True)
    data = str(shapes / "data.yaml")
    ours = val(model, data, img_size=SIZE, batch_size=3, workers=0, verbose=False, plots=False, half=False)
    theirs = val(str(path), data, img_size=SIZE, batch_size=3, workers=0, verbose=False, plots=False)
    for a, b in ((ours.mp, theirs.mp), (ours.mr, theirs.mr), (ours.map50, theirs.map50), (ours.map, theirs.map)):
        assert a == pytest.approx(b, abs=1e-3)
    images = sorted((shapes / "images" / "val").iterdir())[:3]
    expected = predict(model, images, img_size=SIZE, conf=0.3, half=False)
    actual = predict(str(path), images, img_size=SIZE, conf=0.3)
    assert sum(len(r.scores) for r in expected) > 0
    for a, b in zip(expected, actual):
        assert len(a.scores) == len(b.scores) and torch.equal(a.classes, b.classes)
        torch.testing.assert_close(b.rotated, a.rotated, atol=0.05, rtol=1e-4)


def test_the_angle_gain_is_a_run_setting():
    from yolotrain.engine.config import resolve_config

    config = resolve_config(model="yolov8n-obb", angle=2.5)
    criterion, _ = get_task("obb").training_criteria(AnchorFreeYolo("yolov8n-obb", num_classes=2), None, config, None)
    assert (criterion.hyp.angle, criterion.hyp.box, criterion.hyp.dfl) == (2.5, 7.5, 1.5)
