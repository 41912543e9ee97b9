"""The one model object, ``YOLO``: for each task (detect, segment, classify) it trains, then holds the best
weights that val, predict, export and track use, with the command line's setting names; results plot, save
and describe themselves; misspelt settings are one line with the closest name. One tiny run per task is
shared by the module's tests."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import YOLOV5N_WEIGHTS

import yolotrain
from yolotrain import YOLO, ConfigError, Yolov5
from yolotrain.checkpoint import CheckpointError
from yolotrain.cli import build_parser
from yolotrain.data import generate_shapes_dataset
from yolotrain.data.classify import write_shape_crops
from yolotrain.data.shapes_video import generate_shapes_video
from yolotrain.engine import TrainResult
from yolotrain.eval.classify import ClassifyMetrics
from yolotrain.eval.metrics import Metrics
from yolotrain.model.classify import Classifier
from yolotrain.prediction.classify import ClassifyResult
from yolotrain.prediction.run import Result
from yolotrain.track import TrackResult

QUICK = {"workers": 0, "device": "cpu", "epochs": 1, "plots": False, "tensorboard": False}
DETECT = {"img_size": 64, "batch_size": 4, "autoanchor": False, **QUICK}
CLASSIFY = {"img_size": 32, "batch_size": 8, **QUICK}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=8, n_val=4, img_size=64) / \
        "data.yaml"


@pytest.fixture(scope="module")
def crops(tmp_path_factory) -> Path:
    return write_shape_crops(tmp_path_factory.mktemp("crops") / "shapes-cls", n_train=6, n_val=3)


def _trained(source: str, data: Path, settings: dict, runs: Path) -> tuple[YOLO, TrainResult]:
    model = YOLO(source)
    return model, model.train(data=str(data), project=str(runs), **settings)


@pytest.fixture(scope="module")
def detector(shapes, tmp_path_factory) -> tuple[YOLO, TrainResult]:
    return _trained("yolov5n", shapes, DETECT, tmp_path_factory.mktemp("detect-runs"))


@pytest.fixture(scope="module")
def segmenter(shapes, tmp_path_factory) -> tuple[YOLO, TrainResult]:
    # The reference's spelling of a published architecture: its YAML's name, no such file here.
    return _trained("yolov5n-seg.yaml", shapes, DETECT, tmp_path_factory.mktemp("segment-runs"))


@pytest.fixture(scope="module")
def classifier(crops, tmp_path_factory) -> tuple[YOLO, TrainResult]:
    return _trained("yolov5n-cls", crops, CLASSIFY, tmp_path_factory.mktemp("classify-runs"))


def val_images(data_yaml: Path) -> Path:
    return data_yaml.parent / "images" / "val"


# After training the object holds the best weights


@pytest.mark.parametrize(("fixture", "task", "kind"), [("detector", "detect", Yolov5),
                                                       ("segmenter", "segment", Yolov5),
                                                       ("classifier", "classify", Classifier)])
def test_train_returns_the_run_and_the_object_holds_its_best_weights(fixture, task, kind, request):
    model, result = request.getfixturevalue(fixture)
    assert isinstance(result, TrainResult) and result.epochs_run == 1
    assert model.source == f"{result.best}.json" and isinstance(model.model, kind)
    assert model.task == task and model.names == ["circle", "rectangle"]
    saved = yolotrain.load(result.best)  # the free function reads the same weights
    for mine, theirs in zip(model.model.state_dict().values(), saved.state_dict().values()):
        torch.testing.assert_close(mine, theirs)


# Validation


def test_detection_val_defaults_to_the_data_it_was_trained_on(detector, tmp_path):
    model, _ = detector
    metrics = model.val(project=str(tmp_path), img_size=64, batch_size=4, workers=0)
    assert isinstance(metrics, Metrics) and 0 <= metrics.map <= 1
    assert (tmp_path / "exp").is_dir()


def test_segmentation_val_reports_masks(segmenter, shapes, tmp_path):
    model, _ = segmenter
    metrics = model.val(data=str(shapes), project=str(tmp_path), img_size=64, workers=0, plots=False)
    assert isinstance(metrics, Metrics) and metrics.masks is not None


def test_classifier_val_is_accuracy(classifier, tmp_path):
    model, _ = classifier
    metrics = model.val(project=str(tmp_path), img_size=32, workers=0)
    assert isinstance(metrics, ClassifyMetrics) and 0 <= metrics.top1 <= 1


def test_val_of_a_model_without_recorded_data_asks_for_data():
    with pytest.raises(ConfigError, match="^YOLO.val: data: give the dataset"):
        YOLO("yolov5n").val()


# Prediction and its results


def test_detection_predict_results_carry_tensors_and_outputs(detector, shapes, tmp_path, monkeypatch):
    model, _ = detector
    monkeypatch.chdir(tmp_path)
    results = model.predict(str(val_images(shapes)), conf=0.001, img_size=64, max_det=5)
    assert not (tmp_path / "runs").exists()  # from Python nothing is saved unless asked
    assert len(results) == 4 and all(isinstance(r, Result) for r in results)
    first = results[0]
    assert first.boxes.shape == (len(first.scores), 4) and first.classes.dtype == torch.long
    picture = first.plot()
    assert picture.dtype == np.uint8 and picture.shape == (*first.orig_shape, 3)
    assert first.save(tmp_path / "out" / "first.png").is_file()
    described = json.loads(first.to_json())
    assert described == first.to_dict() and len(described["detections"]) == len(first.scores)
    table = first.to_df()
    assert len(table) == len(first.scores)
    if len(table):
        assert {"source", "x1", "y1", "x2", "y2", "score", "class", "name"} <= set(table.columns)
        np.testing.assert_allclose(table[["x1", "y1", "x2", "y2"]].to_numpy(), first.boxes.numpy(), atol=0.01)


def test_calling_the_object_predicts_an_array_and_keeps_it_for_plot(detector, shapes):
    model, _ = detector
    image = cv2.imread(str(next(val_images(shapes).iterdir())))
    called = model(image, conf=0.001, img_size=64)
    predicted = model.predict(image, conf=0.001, img_size=64)
    torch.testing.assert_close(called[0].boxes, predicted[0].boxes)
    assert called[0].image is not None and called[0].plot().shape == image.shape
    # The free function's results keep no image: plot then asks for it, in one line.
    free = yolotrain.predict(model.model, image, conf=0.001, img_size=64, device="cpu")
    with pytest.raises(ValueError, match=r"plot\(image=\.\.\.\)"):
        free[0].plot()
    assert free[0].plot(image=image).shape == image.shape


def test_predict_saves_a_run_folder_when_asked(detector, shapes, tmp_path):
    model, _ = detector
    model.predict(str(val_images(shapes)), save=True, save_txt=True, img_size=64, project=str(tmp_path))
    run = tmp_path / "exp"
    assert len(list(run.glob("*.jpg"))) == 4 and len(list((run / "labels").glob("*.txt"))) == 4
    assert len(json.loads((run / "predictions.json").read_text())) == 4


def test_video_frames_are_read_again_to_plot(detector, tmp_path):
    model, _ = detector
    clip = generate_shapes_video(tmp_path / "data", frames=3)
    results = model.predict(str(clip / "shapes.mp4"), img_size=64)
    assert [r.frame for r in results] == [0, 1, 2] and all(r.image is None for r in results)
    assert results[2].plot().shape == (*results[2].orig_shape, 3)


def test_segmentation_predict_results_carry_masks(segmenter, shapes):
    model, _ = segmenter
    results = model.predict(str(val_images(shapes)), conf=0.001, img_size=64, max_det=5)
    assert len(results) == 4
    for result in results:
        assert result.masks is not None and result.masks.shape == (len(result.scores), *result.orig_shape)
    assert results[0].plot().shape == (*results[0].orig_shape, 3)


def test_classifier_predict_results_carry_probabilities(classifier, crops):
    model, _ = classifier
    image = next((crops / "val" / "circle").iterdir())
    results = model.predict(str(image), img_size=32)
    assert len(results) == 1 and isinstance(results[0], ClassifyResult)
    probs = results[0].probs
    assert probs.shape == (2,) and float(probs.sum()) == pytest.approx(1, abs=1e-5)
    table = results[0].to_df()
    assert list(table["name"]) == [model.names[i] for i in results[0].top5] and "probability" in table
    assert results[0].plot().shape == (*results[0].orig_shape, 3)
    assert json.loads(results[0].to_json())["top5"][0]["class"] == results[0].top1


def test_to_df_without_pandas_is_one_line(detector, shapes, monkeypatch):
    model, _ = detector
    result = model.predict(str(next(val_images(shapes).iterdir())), img_size=64)[0]
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"^to_df needs pandas: pip install pandas$"):
        result.to_df()


# Export: the object's own weights, run again through the export


@pytest.mark.parametrize("fixture", ["detector", "segmenter", "classifier"])
def test_export_onnx_predicts_as_the_checkpoint(fixture, request, shapes, crops, tmp_path):
    model, result = request.getfixturevalue(fixture)
    size = 32 if model.task == "classify" else 64
    path = model.export(format="onnx", img_size=size, output=str(tmp_path / "model.onnx"), simplify=False)
    assert path == tmp_path / "model.onnx" and path.is_file()
    exported = YOLO(path)
    assert exported.task == model.task and exported.names == model.names
    source = str(next((crops / "val" / "circle").iterdir())) if model.task == "classify" else \
        str(val_images(shapes))
    mine = model.predict(source, img_size=size, conf=0.001)
    theirs = exported.predict(source, img_size=size, conf=0.001)
    assert len(mine) == len(theirs)
    if model.task == "classify":
        torch.testing.assert_close(mine[0].probs, theirs[0].probs, atol=1e-3, rtol=1e-3)
    with pytest.raises(CheckpointError, match="an exported model"):
        exported.export(format="onnx")
    with pytest.raises(ValueError, match="info"):
        exported.info()


def test_export_of_a_checkpoint_goes_beside_it(detector):
    model, result = detector
    path = model.export(format="onnx", img_size=64, simplify=False)
    assert path == result.best.with_name("best.onnx") and path.is_file()


def test_export_of_a_named_architecture_goes_to_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = YOLO("yolov5n").export(format="onnx", img_size=64, simplify=False)
    assert path.resolve() == (tmp_path / "yolov5n.onnx").resolve() and path.is_file()


# Tracking


def test_track_the_shapes_video_with_the_commands_settings(detector, tmp_path):
    model, _ = detector
    clip = generate_shapes_video(tmp_path / "data", frames=6)
    results = model.track(str(clip / "shapes.mp4"), img_size=64, conf=0.001, max_det=6, tracker="botsort",
                          eval=str(clip), project=str(tmp_path / "runs"))
    assert len(results) == 6 and all(isinstance(r, TrackResult) for r in results)
    assert [r.mot_frame for r in results] == [1, 2, 3, 4, 5, 6]
    run = tmp_path / "runs" / "exp"
    assert (run / "mot" / "shapes.txt").is_file() and "HOTA" in json.loads((run / "metrics.json").read_text())["shapes"]
    assert results[0].plot().shape == (*results[0].orig_shape, 3)


def test_track_without_saving_writes_nothing(detector, tmp_path, monkeypatch):
    model, _ = detector
    clip = generate_shapes_video(tmp_path / "data", frames=3)
    monkeypatch.chdir(tmp_path)
    assert len(model.track(str(clip / "shapes.mp4"), img_size=64)) == 3
    assert not (tmp_path / "runs").exists()


# Tuning


def test_tune_searches_for_this_model_and_leaves_it_as_it_is(detector, shapes, tmp_path):
    pytest.importorskip("optuna")
    model, result = detector
    found = model.tune(data=str(shapes), trials=1, project=str(tmp_path), name="study", **DETECT)
    assert found.trials["COMPLETE"] == 1 and found.save_dir == tmp_path / "study"
    assert model.source == f"{result.best}.json"


# Settings: the command line's names, checked by the typed configurations


@pytest.mark.parametrize(("method", "call", "message"), [
    ("train", lambda m: m.train(epoch=3), "YOLO.train: unknown setting 'epoch'; did you mean 'epochs'?"),
    ("val", lambda m: m.val(batch_sise=8), "YOLO.val: unknown setting 'batch_sise'; did you mean 'batch_size'?"),
    ("predict", lambda m: m.predict("x.jpg", confx=0.3), "YOLO.predict: unknown setting 'confx'; did you mean 'conf'?"),
    ("export", lambda m: m.export(formt="onnx"), "YOLO.export: unknown setting 'formt'; did you mean 'format'?"),
    ("track", lambda m: m.track("x.mp4", traker="botsort"),
     "YOLO.track: unknown setting 'traker'; did you mean 'tracker'?"),
    ("tune", lambda m: m.tune(trialz=3), "YOLO.tune: unknown setting 'trialz'; did you mean 'trials'?"),
])
def test_a_misspelt_setting_is_one_line_with_the_closest_name(method, call, message):
    with pytest.raises(ConfigError) as caught:
        call(YOLO("yolov5n"))
    assert str(caught.value) == message


@pytest.mark.parametrize("call", [lambda m: m.train(model="yolov5s"), lambda m: m.val(weights="a.pt"),
                                  lambda m: m.predict("x.jpg", weights="a.pt")])
def test_the_model_is_the_objects_own(call):
    with pytest.raises(ConfigError, match="the model is this object's own"):
        call(YOLO("yolov5n"))


def test_a_bad_value_is_checked_by_the_configuration():
    with pytest.raises(ConfigError, match="^img_size: expected an integer or null, got 'big'$"):
        YOLO("yolov5n").predict("x.jpg", img_size="big")


@pytest.mark.parametrize(("command", "method"), [("train", "train"), ("val", "val"), ("predict", "predict"),
                                                 ("export", "export"), ("track", "track"), ("tune", "tune")])
def test_every_setting_of_the_command_line_is_a_keyword(command, method, tmp_path, monkeypatch):
    """Each option of the command (its setting's name) passes the method's name check: the method fails
    later, on the value, never on the name."""
    monkeypatch.chdir(tmp_path)
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    hidden = {"help", "refused", "unsupported", "local_rank", "cfg", "evolve", "save_conf", "verbose"}
    names = {a.dest for a in sub._actions if a.help != "==SUPPRESS==" and a.dest not in hidden}
    names -= {"weights", "model", "source"}  # the object's model; the source is the methods' argument
    model = YOLO("yolov5n")
    for name in sorted(names):
        with pytest.raises(Exception) as caught:  # anything but an unknown name
            getattr(model, method)(*(["missing.jpg"] if method in ("predict", "track") else []),
                                   **{name: object()})
        assert "unknown setting" not in str(caught.value), name


# The model summary


def test_info_prints_layers_parameters_and_gflops(capsys):
    summary = YOLO("yolov5n").info()
    line = capsys.readouterr().out.strip()
    assert line == str(summary) and line.startswith("yolov5n summary: ") and "GFLOPs at 640x640" in line
    assert summary.parameters == summary.gradients == 1_872_157  # the reference's count for yolov5n
    assert summary.gflops == pytest.approx(4.5, abs=0.1)  # the reference's 4.5 GFLOPs at 640
    assert summary.layers == sum(1 for _ in YOLO("yolov5n").model.modules())


# Official weights


def test_official_weights_predict_and_export_beside_themselves(tmp_path, coco128):
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
    weights = tmp_path / "yolov5n.pt"
    shutil.copyfile(YOLOV5N_WEIGHTS, weights)  # the export goes beside the weights: never into the shared folder
    model = YOLO(weights)
    assert model.task == "detect" and len(model.names) == 80 and model.names[0] == "person"
    image = sorted((coco128 / "images" / "train2017").glob("*.jpg"))[0]
    results = model(str(image), img_size=320)
    assert len(results[0].scores) > 0
    assert model.export(format="onnx", img_size=320, simplify=False) == tmp_path / "yolov5n.onnx"
