"""The pose task end to end on the shapes' keypoint variant: a pose model trains (chosen for a dataset with
kpt_shape, its head made for the data's keypoints), its checkpoint keeps kpt_shape, val scores boxes and keypoints
(OKS) and writes ultralytics' pose rows and COCO keypoint results, predict and track carry the keypoints in
original pixels, and the ONNX export gives what PyTorch gives."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_train import run_cli

from yolotrain import YOLO, predict, train, val
from yolotrain.checkpoint import CheckpointError
from yolotrain.data import generate_shapes_dataset
from yolotrain.data.check import check_dataset
from yolotrain.data.shapes_video import generate_shapes_video
from yolotrain.draw import COCO_SKELETON, draw_keypoints
from yolotrain.engine import resolve_config
from yolotrain.engine.loggers import TAGS
from yolotrain.eval.metrics import ULTRALYTICS_SCORING
from yolotrain.eval.pose import COCO_KEYPOINT_SIGMAS
from yolotrain.interop import export, load_checkpoint, load_exported
from yolotrain.prediction.run import Result
from yolotrain.task import get_task
from yolotrain.tasks.pose.evaluate import ImageKeypoints, keypoints_to_original, pose_rows
from yolotrain.track import TrackerConfig, track

TINY = {"img_size": 64, "batch_size": 4, "workers": 0, "device": "cpu"}
KPT_SHAPE = (4, 3)  # the shapes' keypoints: a box's four corners, with visibility


@pytest.fixture(scope="module")
def pose_data(tmp_path_factory) -> Path:
    return generate_shapes_dataset(root=tmp_path_factory.mktemp("pose"), n_train=8, n_val=4, img_size=64,
                                   labels="pose") / "data.yaml"


@pytest.fixture(scope="module")
def trained(pose_data, tmp_path_factory):
    """Two epochs of the default pose model (no --model: the data's kpt_shape picks it)."""
    return train(data=str(pose_data), epochs=2, project=str(tmp_path_factory.mktemp("runs")), **TINY)


def results(run: Path) -> list[dict[str, str]]:
    with (run / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_dataset_with_keypoints_takes_the_pose_recipe_and_its_default_model(pose_data):
    config = resolve_config(data=str(pose_data))
    assert (config.task, config.model) == ("pose", "yolov8n-pose")
    assert (config.loss.box, config.loss.pose, config.loss.kobj, config.eval.iou) == (7.5, 12.0, 1.0, 0.7)
    assert resolve_config(model="yolo11n-pose").task == "pose"


def test_a_pose_model_trains_on_keypoints_and_reports_them(trained):
    rows = results(trained.save_dir)
    assert list(rows[0])[:6] == ["epoch", "train_box", "train_pose", "train_kobj", "train_cls", "train_dfl"]
    assert {"pose_precision", "pose_recall", "pose_mAP50", "pose_mAP50-95", "val_pose", "val_kobj"} <= set(rows[0])
    assert float(rows[-1]["train_pose"]) > 0 and float(rows[-1]["val_pose"]) > 0 and rows[-1]["pose_mAP50"] != ""
    model, meta = load_checkpoint(trained.last)
    assert (model.task, model.kpt_shape, meta["kpt_shape"], meta["names"]) == (
        "pose", KPT_SHAPE, list(KPT_SHAPE), ["circle", "rectangle"])
    assert (trained.save_dir / "train_batch0.jpg").is_file() and (trained.save_dir / "val_batch0_pred.jpg").is_file()
    assert TAGS["pose_mAP50-95"] == "metrics/mAP50-95(P)" and TAGS["val_kobj"] == "val/kobj_loss"


def test_a_detection_model_on_keypoint_data_is_one_line(pose_data, tmp_path):
    with pytest.raises(Exception, match="yolov8n is not a pose model") as error:
        train(data=str(pose_data), model="yolov8n", epochs=1, project=str(tmp_path), **TINY)
    assert "\n" not in str(error.value)


def test_val_scores_keypoints_and_writes_pose_rows_and_coco_keypoints(trained, pose_data, tmp_path):
    pytest.importorskip("pycocotools")
    metrics = val(str(trained.last), str(pose_data), img_size=64, save_dir=tmp_path, save_json=True, save_txt=True,
                  save_conf=True, verbose=False, workers=0)
    assert metrics.keypoints is not None and 0 <= metrics.keypoints.map50 <= 1
    assert len(metrics.keypoints.coco) == 10  # pycocotools' keypoint summary
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    assert predictions and all(len(p["keypoints"]) == 12 for p in predictions)
    ground_truth = json.loads((tmp_path / "ground_truth.json").read_text())
    assert all(len(a["keypoints"]) == 12 and 0 <= a["num_keypoints"] <= 4 for a in ground_truth["annotations"])
    for labels in (tmp_path / "labels").glob("*.txt"):
        assert all(len(row.split()) == 5 + 12 + 1 for row in labels.read_text().splitlines())
    assert (tmp_path / "val_batch0_labels.jpg").is_file()


def test_keypoint_scoring_of_perfect_predictions_is_one():
    """The detections are the labels themselves, keypoints and all: box and pose mAP are the best ultralytics'
    interpolated AP gives (0.995)."""
    task = get_task("pose").for_model(type("M", (), {"kpt_shape": KPT_SHAPE})())
    stats = task.val_stats(2, ULTRALYTICS_SCORING)
    boxes = torch.tensor([[10.0, 10, 30, 40], [5, 30, 25, 60]])
    points = torch.tensor([[[10.0, 10, 2], [30, 10, 2], [30, 40, 2], [10, 40, 0]],
                           [[5.0, 30, 2], [25, 30, 2], [25, 60, 2], [5, 60, 2]]])
    det = torch.cat((boxes, torch.tensor([[0.9, 0], [0.8, 1]]), points.flatten(1)), 1)
    labels = ImageKeypoints(points, (1.0, 1.0), (0.0, 0.0))
    task.score_image(stats, det, det[:, :6], boxes, torch.tensor([0.0, 1.0]), None, labels, (64, 64))
    metrics = stats.compute(["a", "b"])
    assert metrics.map == pytest.approx(0.995) and metrics.keypoints.map == pytest.approx(0.995)
    assert torch.equal(get_task("pose").for_model(type("M", (), {"kpt_shape": (17, 3)})()).val_stats(
        1, stats.rules).sigmas, COCO_KEYPOINT_SIGMAS)


def test_keypoints_move_to_the_original_image_as_boxes_do():
    points = torch.tensor([[[40.0, 20, 0.9], [0, 70, 0.1]]])
    original = keypoints_to_original(points, (0.5, 0.5), (8.0, 4.0), (100, 200))
    assert torch.equal(original, torch.tensor([[[64.0, 32, 0.9], [0, 100, 0.1]]]))  # clipped to the 200 x 100 image
    rows = pose_rows(torch.tensor([[0.0, 0, 100, 50, 0.5, 1]]), [np.array([[50.0, 25, 1]])], (50, 100), True)
    assert rows == "1 0.5 0.5 1 1 0.5 0.5 1 0.5\n"


def test_predict_carries_keypoints_in_original_pixels_and_draws_them(trained, pose_data, tmp_path):
    image = pose_data.parent / "images" / "val" / "00000.jpg"
    big = tmp_path / "big.jpg"
    cv2.imwrite(str(big), cv2.resize(cv2.imread(str(image)), (128, 96)))
    result = predict(str(trained.last), str(big), img_size=64, conf=0.0, save_dir=tmp_path / "out", save_txt=True,
                     device="cpu")[0]
    assert isinstance(result, Result) and result.keypoints.shape == (len(result.boxes), *KPT_SHAPE)
    # The same detections from the network input (64 x 48 after the resize), scaled by 2 into the original image.
    model, _ = load_checkpoint(trained.last)
    assert result.keypoints[..., :2].max() > 64  # original pixels, not the input's
    entry = result.to_dict()["detections"][0]
    assert len(entry["keypoints"]) == 12
    rows = (tmp_path / "out" / "labels" / "big.txt").read_text().splitlines()
    assert rows and all(len(r.split()) == 5 + 12 + 1 for r in rows)
    assert (tmp_path / "out" / "big.jpg").is_file()


def test_track_carries_each_tracks_keypoints_into_its_results_and_saved_files(trained, tmp_path):
    """A few frames of the moving-shapes video: every tracked result's keypoints are those of its tracks' boxes
    ``[n, K, D]``, and the sequence's JSON and label rows carry them with the ids."""
    clip = generate_shapes_video(tmp_path / "data", frames=4)
    tracker = TrackerConfig(tracker_type="bytetrack", track_high_thresh=0.005, track_low_thresh=0.001,
                            new_track_thresh=0.005, fuse_score=False)
    out = tmp_path / "run"
    tracked = track(str(trained.last), clip / "shapes.mp4", tracker, save_dir=out, save_txt=True, conf=0.001,
                    max_det=6, img_size=64, device="cpu")
    assert len(tracked) == 4 and sum(len(r.ids) for r in tracked) > 0
    for result in tracked:
        assert result.keypoints.shape == (len(result.boxes), *KPT_SHAPE) == (len(result.ids), *KPT_SHAPE)
    frames = json.loads((out / "shapes.json").read_text())["frames"]
    saved = [[(t["id"], t["keypoints"]) for t in frame["tracks"]] for frame in frames]
    expected = [[(i, np.round(k.reshape(-1), 3).tolist()) for i, k in zip(r.ids.tolist(), r.keypoints)]
                for r in tracked]
    assert [[i for i, _ in f] for f in saved] == [[i for i, _ in f] for f in expected]
    for frame, frame_expected in zip(saved, expected):
        for (_, points), (_, points_expected) in zip(frame, frame_expected):
            np.testing.assert_allclose(points, points_expected, atol=1e-3)
    rows = [row.split() for label in sorted((out / "labels").iterdir()) for row in label.read_text().splitlines()]
    assert len(rows) == sum(len(r.ids) for r in tracked)
    assert all(len(row) == 5 + 12 + 2 for row in rows)  # class, box, keypoints, score, id
    assert (out / "shapes.mp4").stat().st_size > 0


def test_keypoints_are_drawn_as_points_with_coco_skeleton():
    canvas = np.zeros((64, 64, 3), np.uint8)
    person = np.zeros((1, 17, 3))
    person[0, :, :2] = np.stack((np.linspace(5, 60, 17), np.linspace(5, 60, 17)), 1)
    person[0, :, 2] = 1.0
    person[0, 0, 2] = 0.1  # not visible: not drawn
    drawn = draw_keypoints(canvas, person)
    assert drawn[5, 5].sum() == 0 and drawn[int(person[0, 16, 1]), int(person[0, 16, 0])].sum() > 0
    assert len(COCO_SKELETON) == 19 and not canvas.any()


def test_onnx_export_gives_keypoints_as_torch_does_and_val_agrees(trained, pose_data, tmp_path):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "pose.onnx"
    export(str(trained.last), "onnx", out=out, img_size=64)
    runtime = load_exported(out)
    assert (runtime.task, runtime.kpt_shape) == ("pose", KPT_SHAPE)
    model, _ = load_checkpoint(trained.last)
    imgs = torch.rand(1, 3, 64, 64)
    with torch.inference_mode():
        expected = model.eval()(imgs)
    decoded = runtime(imgs)
    assert decoded.shape == expected.shape == (1, 84, 5 + 2 + 12)
    torch.testing.assert_close(decoded, expected, atol=1e-3, rtol=1e-4)
    torch_metrics = val(str(trained.last), str(pose_data), img_size=64, verbose=False, plots=False, workers=0)
    onnx_metrics = val(str(out), str(pose_data), img_size=64, verbose=False, plots=False, workers=0)
    assert onnx_metrics.keypoints.map == pytest.approx(torch_metrics.keypoints.map, abs=1e-3)
    assert onnx_metrics.map == pytest.approx(torch_metrics.map, abs=1e-3)
    a = predict(str(trained.last), str(pose_data.parent / "images" / "val"), img_size=64, device="cpu")
    b = predict(str(out), str(pose_data.parent / "images" / "val"), img_size=64)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.keypoints, y.keypoints, atol=0.05)


@pytest.mark.parametrize(("options", "message"), [({"raw": True}, "--raw is for detection models"),
                                                   ({"nms": True}, "--nms is for detection models")])
def test_what_a_pose_export_cannot_have_is_refused_in_one_line(trained, tmp_path, options, message):
    with pytest.raises(ValueError, match=message) as error:
        export(str(trained.last), "onnx", out=tmp_path / "x.onnx", img_size=64, **options)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_the_command_line_trains_a_pose_model(pose_data, tmp_path):
    run = run_cli("train", "--model", "yolov8n-pose", "--data", str(pose_data), "--epochs", "1", "--img", "64",
                  "--batch", "4", "--workers", "0", "--device", "cpu", "--project", str(tmp_path), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "pose_mAP50" in (tmp_path / "exp" / "results.csv").read_text().splitlines()[0]


@pytest.mark.slow
def test_the_yolo_object_trains_validates_and_predicts_a_pose_model(pose_data, tmp_path):
    model = YOLO("yolov8n-pose")
    model.train(data=str(pose_data), epochs=1, project=str(tmp_path), val=False, **TINY)
    assert model.model.kpt_shape == KPT_SHAPE
    metrics = model.val(data=str(pose_data), img_size=64, workers=0, plots=False)
    assert metrics.keypoints is not None
    result = model.predict(str(pose_data.parent / "images" / "val" / "00000.jpg"), img_size=64, conf=0.0)[0]
    assert result.keypoints.shape[1:] == KPT_SHAPE


@pytest.mark.slow
def test_a_resumed_pose_run_ends_where_the_whole_run_ends(pose_data, tmp_path):
    settings = dict(data=str(pose_data), model="yolov8n-pose", epochs=2, val=False, **TINY)
    whole = train(project=str(tmp_path / "whole"), **settings)

    def stop_after_first_epoch(trainer, epoch, *rest):
        trainer.stop = True

    cut = train(project=str(tmp_path / "cut"), callbacks={"on_fit_epoch_end": stop_after_first_epoch}, **settings)
    resumed = train(resume=str(cut.last))
    assert (cut.epochs_run, resumed.epochs_run) == (1, 1)
    a, b = load_file(f"{whole.last}.safetensors"), load_file(f"{resumed.last}.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert results(whole.save_dir)[-1]["train_pose"] == results(resumed.save_dir)[-1]["train_pose"]


def test_data_check_reads_a_pose_dataset_as_keypoints_and_previews_them(pose_data, tmp_path):
    result = check_dataset(pose_data, tmp_path, img_size=64)
    assert result.train.labelled == 8 and not result.train.issues and result.preview.is_file()


@pytest.mark.parametrize(("value", "message"), [
    ("[5, 3]", r"strides \[8, 16, 32\], nc 2 and kpt_shape \[5, 3\] mean an output of"),
    ("[4, 7]", "yolotrain metadata field 'kpt_shape' must be"),
])
def test_a_pose_export_whose_kpt_shape_is_edited_is_one_line_at_load(trained, tmp_path, value, message):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    path = tmp_path / "pose.onnx"
    export(str(trained.last), "onnx", out=path, img_size=64)
    proto = onnx.load(str(path))
    next(p for p in proto.metadata_props if p.key == "kpt_shape").value = value
    onnx.save(proto, str(path))
    with pytest.raises(CheckpointError, match=message) as error:
        load_exported(path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("fmt", "suffix"), [
    ("torchscript", ".torchscript"),
    pytest.param("openvino", ".xml", marks=pytest.mark.skipif(importlib.util.find_spec("openvino") is None,
                                                               reason="pip install 'yolotrain[openvino]'")),
])
def test_torchscript_and_openvino_exports_give_what_torch_gives(trained, tmp_path, fmt, suffix):
    out = tmp_path / f"pose{suffix}"
    export(str(trained.last), fmt, out=out, img_size=64)
    runtime = load_exported(out, trust_code=True)
    assert (runtime.task, runtime.kpt_shape) == ("pose", KPT_SHAPE)
    model, _ = load_checkpoint(trained.last)
    imgs = torch.rand(1, 3, 64, 64)
    with torch.inference_mode():
        expected = model.eval()(imgs)
    torch.testing.assert_close(runtime(imgs), expected, atol=1e-3, rtol=1e-4)
