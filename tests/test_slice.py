"""Sliced inference (``--slice``, ``--slice-overlap``): the tiles cover each image with the overlap asked for,
each tile's boxes land in the image's pixels exactly, and val, predict, the commands and :class:`yolotrain.YOLO`
take the settings; what slicing does not run is refused in one line."""

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import COCO128, YOLOV5N_WEIGHTS

from yolotrain import YOLO, Yolov5
from yolotrain.checkpoint import save_checkpoint
from yolotrain.cli import main
from yolotrain.eval import val
from yolotrain.eval.inference import load_one_model
from yolotrain.eval.slicing import SlicedDetector, tile_boxes, tile_origins
from yolotrain.eval.tta import AugmentedDetector
from yolotrain.model.classify import Classifier
from yolotrain.prediction import predict


@pytest.mark.parametrize(("length", "tile", "overlap"), [
    (2560, 640, 0.2), (1280, 640, 0.0), (1000, 256, 0.5), (641, 640, 0.2), (1920, 640, 0.9), (704, 96, 0.25),
])
def test_tiles_cover_the_side_overlapping_by_at_least_the_overlap(length, tile, overlap):
    origins = tile_origins(length, tile, overlap)
    assert origins[0] == 0 and origins[-1] == length - tile  # the last tile flush with the border
    assert origins == sorted(set(origins))
    for before, after in zip(origins, origins[1:]):
        assert before + tile - after >= overlap * tile  # neighbours overlap by at least the fraction asked
    # The fewest tiles: one less would leave a gap or an overlap below the one asked.
    fewer = len(origins) - 1
    assert fewer == 1 or (length - tile) / (fewer - 1) > tile * (1 - overlap)
    covered = np.zeros(length, bool)
    for origin in origins:
        covered[origin:origin + tile] = True
    assert covered.all()


def test_exact_multiples_without_overlap_tile_side_by_side():
    assert tile_origins(1280, 640, 0.0) == [0, 640]
    assert tile_origins(2560, 640, 0.2) == [0, 480, 960, 1440, 1920]


@pytest.mark.parametrize(("height", "width"), [(320, 320), (64, 576), (200, 96)])
def test_a_side_no_longer_than_a_tile_is_one_tile_of_that_side(height, width):
    tiles = tile_boxes(height, width, 320, 0.2)
    assert {(top, th) for top, _, th, _ in tiles} == {(0, height)}  # every side here is at most one tile high
    columns = {(0, width)} if width <= 320 else {(0, 320), (width - 320, 320)}
    assert {(left, tw) for _, left, _, tw in tiles} == columns
    if width <= 320:
        assert tiles == [(0, 0, height, width)]


def _tile_predictions(model, imgs: torch.Tensor, tile: int, overlap: float) -> torch.Tensor:
    """Each tile predicted alone, one image at a time, its boxes moved by the tile's origin: ``[B, N', 5+nc]``."""
    per_image = []
    for img in imgs:
        moved = []
        for top, left, th, tw in tile_boxes(*imgs.shape[2:], tile, overlap):
            pred = model(img[None, :, top:top + th, left:left + tw])[0].float()
            moved.append(torch.cat((pred[:, :1] + left, pred[:, 1:2] + top, pred[:, 2:]), 1))
        per_image.append(torch.cat(moved))
    return torch.stack(per_image)


@pytest.mark.parametrize("augment", [False, True])
def test_sliced_predictions_are_each_tiles_moved_to_the_image(model, augment):
    """A random-init yolov5n: the sliced predictions of a batch of two images are, image by image, those of
    each of its tiles predicted alone, offset by the tile's origin (test-time augmentation inside the tiles)."""
    imgs = torch.rand(2, 3, 256, 352, generator=torch.Generator().manual_seed(0))
    inner = AugmentedDetector(model) if augment else model
    sliced = SlicedDetector(inner, 128, 0.25)
    with torch.inference_mode():
        expected = _tile_predictions(inner, imgs, 128, 0.25)
        got = sliced(imgs)
    assert len(tile_boxes(256, 352, 128, 0.25)) == 3 * 4
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)


@pytest.fixture(scope="module")
def yolov5n() -> Yolov5:
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"weights not found at {YOLOV5N_WEIGHTS}")
    return load_one_model(str(YOLOV5N_WEIGHTS), "cpu", half=False)[0]


@pytest.fixture(scope="module")
def coco_image() -> np.ndarray:
    image = cv2.imread(str(COCO128 / "images" / "train2017" / "000000000009.jpg"))
    if image is None:
        pytest.skip(f"shared dataset not found at {COCO128}")
    return cv2.resize(image, (640, 640), interpolation=cv2.INTER_AREA)


def test_yolov5n_sliced_predictions_are_its_tiles_moved(yolov5n, coco_image):
    rgb = torch.from_numpy(cv2.cvtColor(coco_image, cv2.COLOR_BGR2RGB)).permute(2, 0, 1).float() / 255
    canvas = torch.full((1, 3, 960, 1280), 114 / 255)
    canvas[0, :, 200:840, 500:1140] = rgb
    with torch.inference_mode():
        expected = _tile_predictions(yolov5n, canvas, 640, 0.2)
        got = SlicedDetector(yolov5n, 640, 0.2)(canvas)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)


def test_yolov5n_sliced_detections_of_a_tile_are_its_own_moved(yolov5n, coco_image):
    """A 1280 px canvas whose bottom-right 640 px tile is a coco128 image and the rest black: the sliced
    detections (no overlap: four tiles side by side) are the image's own detections at 640, moved by 640 px."""
    canvas = np.zeros((1280, 1280, 3), np.uint8)
    canvas[640:, 640:] = coco_image
    options = {"device": "cpu", "half": False}
    alone = predict(yolov5n, coco_image, img_size=640, **options)[0]
    sliced = predict(yolov5n, canvas, img_size=1280, slice=640, slice_overlap=0.0, **options)[0]
    assert len(alone.scores) > 0
    torch.testing.assert_close(sliced.boxes.xyxy, alone.boxes.xyxy + 640, rtol=0, atol=1e-3)
    torch.testing.assert_close(sliced.scores, alone.scores)
    assert torch.equal(sliced.classes, alone.classes)
    # Without slicing the image is a quarter of the input, its objects half their size: other detections.
    whole = predict(yolov5n, canvas, img_size=1280, **options)[0]
    assert len(whole.scores) != len(sliced.scores) or not torch.allclose(whole.boxes.xyxy, sliced.boxes.xyxy)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """A random-init two-class checkpoint of the shapes classes and a two-image shapes dataset's YAML."""
    from yolotrain.data import generate_shapes_dataset

    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2).eval()
    model.names = ["circle", "rectangle"]
    weights = save_checkpoint(root / "weights" / "tiny", model)
    data = generate_shapes_dataset(root=root / "shapes", n_train=2, n_val=2, img_size=128) / "data.yaml"
    return weights, data


def test_val_predict_and_yolo_take_slicing(tiny, tmp_path, monkeypatch):
    weights, data = tiny
    monkeypatch.chdir(tmp_path)
    options = {"img_size": 128, "device": "cpu", "workers": 0, "half": False, "plots": False}

    def detections(run, **more) -> list[torch.Tensor]:
        found: list[torch.Tensor] = []
        run(callbacks={"on_val_image_end": lambda path, det: found.append(det.clone())}, **options, **more)
        return found

    through_yolo = detections(YOLO(str(weights)).val, data=str(data), slice=64, slice_overlap=0.25)
    direct = detections(lambda **kw: val(str(weights), data, verbose=False, **kw), slice=64, slice_overlap=0.25)
    plain = detections(lambda **kw: val(str(weights), data, verbose=False, **kw))
    assert all(torch.equal(a, b) for a, b in zip(through_yolo, direct, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(direct, plain, strict=True))
    image = (np.random.default_rng(0).random((128, 128, 3)) * 255).astype(np.uint8)
    plain = YOLO(str(weights)).predict(image, img_size=128, device="cpu", conf=0.0)[0]
    sliced = YOLO(str(weights)).predict(image, img_size=128, device="cpu", conf=0.0, slice=64)[0]
    assert not torch.equal(plain.scores, sliced.scores)


def test_commands_take_slice_options(tiny, tmp_path, monkeypatch):
    weights, data = tiny
    monkeypatch.chdir(tmp_path)
    assert main(["val", "--weights", str(weights), "--data", str(data), "--imgsz", "128", "--slice", "64",
                 "--slice-overlap", "0.25", "--device", "cpu", "--workers", "0", "--no-plots"]) in (0, 1)
    assert (tmp_path / "runs" / "val" / "exp" / "metrics.json").is_file()
    image = tmp_path / "x.png"
    cv2.imwrite(str(image), np.full((128, 192, 3), 128, np.uint8))
    assert main(["predict", "--weights", str(weights), "--source", str(image), "--imgsz", "192", "--slice", "64",
                 "--slice-overlap", "0.5", "--device", "cpu", "--conf-thres", "0"]) == 0
    predictions = json.loads((tmp_path / "runs" / "predict" / "exp" / "predictions.json").read_text())
    assert len(predictions) == 1 and predictions[0]["width"] == 192


def test_a_tile_off_the_stride_is_rounded_up_with_a_warning(model):
    with pytest.warns(UserWarning, match=r"^--slice 80 is not a multiple of the model's stride 32: tiles of 96 px$"):
        assert SlicedDetector(model, 80).tile == 96


@pytest.mark.parametrize(("options", "message"), [
    ({"slice": -64}, "--slice must be a tile side in px (0: off), got -64"),
    ({"slice": 64, "slice_overlap": 1.0}, "--slice-overlap must be at least 0 and below 1 (a fraction of a tile), "
                                          "got 1.0"),
    ({"slice": 64, "slice_overlap": -0.1}, "--slice-overlap must be at least 0 and below 1 (a fraction of a tile), "
                                           "got -0.1"),
])
def test_bad_slice_settings_are_one_line(model, options, message):
    with pytest.raises(ValueError) as raised:
        predict(model, np.zeros((64, 64, 3), np.uint8), device="cpu", **options)
    assert str(raised.value) == message


@pytest.mark.parametrize(("option", "message"), [
    (["--slice-overlap", "1"], "--slice-overlap must be at least 0 and below 1"),
    (["--slice", "-64"], "slicing.slice: must be at least 0, got -64"),
])
def test_bad_slice_options_are_one_line(option, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for command, rest in (("val", ["--data", "data.yaml"]), ("predict", ["--source", "x.jpg"])):
        assert main([command, "--weights", "a.pt", "--slice", "64", *option, *rest]) != 0
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"yolotrain {command}: error: ") and message in err and "\n" not in err
    assert not any(tmp_path.iterdir())


def test_slicing_a_classifier_is_one_line():
    with pytest.raises(ValueError) as raised:
        predict(Classifier.from_name("yolov5n-cls", 2, ["circle", "rectangle"]), np.zeros((64, 64, 3), np.uint8),
                slice=32, device="cpu")
    assert str(raised.value) == ("--slice merges the boxes of detection and segmentation models across tiles: the "
                                 "Classifier given is a classifier, which has no boxes")


def test_slicing_an_export_is_one_line(model, tmp_path):
    """Slicing runs PyTorch models only: an export is refused, even one that takes any input size."""
    pytest.importorskip("onnxruntime")
    from yolotrain.interop import export

    path = export(model, "onnx", out=tmp_path / "model.onnx", img_size=96, dynamic_size=True)
    with pytest.raises(ValueError) as raised:
        predict(str(path), np.zeros((96, 96, 3), np.uint8), slice=64, device="cpu")
    assert str(raised.value) == (f"--slice runs PyTorch models on batches of tiles: {path} is an export; give its "
                                 "checkpoint or .pt")
