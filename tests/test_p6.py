"""P6 models (four detection levels, strides 8-64) through the pipeline: training, val, predict, export, doctor.

Kept small: yolov5n6 at 128 px (a multiple of the largest stride, 64).
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from yolotrain import YoloLoss, Yolov5, train
from yolotrain.checkpoint import save_checkpoint
from yolotrain.data import generate_shapes_dataset
from yolotrain.doctor import check_step, lint_paths
from yolotrain.engine import resolve_config
from yolotrain.engine.build import build_data
from yolotrain.engine.trainer import Trainer
from yolotrain.eval import val
from yolotrain.interop import load_checkpoint
from yolotrain.prediction.run import Predictor, predict

MODEL_SOURCES = Path(__file__).resolve().parents[1] / "src" / "yolotrain" / "model"


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    root = generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=4, n_val=3, img_size=128)
    return root / "data.yaml"


@pytest.fixture(scope="module")
def p6_model() -> Yolov5:
    """An untrained yolov5n6 (four output levels, stride 64) for two classes, in eval mode."""
    torch.manual_seed(0)
    detector = Yolov5("n6", num_classes=2, names=["circle", "rectangle"])
    detector.train()
    detector(torch.rand(2, 3, 128, 128))  # BatchNorm statistics away from their defaults
    return detector.eval()


def test_training_a_p6_model_writes_a_loadable_checkpoint(shapes, tmp_path):
    result = train(data=str(shapes), model="yolov5n6", img_size=128, batch_size=2, epochs=1, workers=0,
                   plots=False, project=str(tmp_path / "runs"))
    loaded, meta = load_checkpoint(result.last)
    assert (loaded.version, meta["strides"], meta["img_size"]) == ("n6", [8.0, 16.0, 32.0, 64.0], 128)
    assert "mAP50" in meta["metrics"]  # validation ran on rect batches shaped for stride 64


def test_p6_image_size_defaults_and_checks(shapes, tmp_path):
    trainer = Trainer(resolve_config(data=str(shapes), model="yolov5n6", workers=0, project=str(tmp_path)))
    build_data(trainer)  # builds the model, then sizes the batches for it
    assert trainer.config.data.img_size == 1280 and trainer.val_set.stride == 64
    assert resolve_config(model="yolov5n6").data.img_size == 192  # the shapes size rounded up to stride 64
    with pytest.raises(ValueError, match="image size must be a multiple of 64 .* got 96"):
        build_data(Trainer(resolve_config(data=str(shapes), model="yolov5n6", img_size=96, workers=0)))
    assert Predictor(Yolov5("n6", num_classes=2)).img_size == 1280
    assert Predictor(Yolov5("n", num_classes=2)).img_size == 640
    with pytest.raises(ValueError, match="img_size must be a positive multiple of 64, got 160"):
        Predictor(Yolov5("n6", num_classes=2), img_size=160)


def test_loss_weighs_four_levels(p6_model):
    criterion = YoloLoss(p6_model, rect_training=True)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.9, 0.8], [1, 0, 0.3, 0.6, 0.1, 0.1]])
    detector = copy.deepcopy(p6_model).train()
    loss = criterion(detector(torch.rand(2, 3, 128, 192)), targets)
    loss.backward()
    assert criterion.balance == (4.0, 1.0, 0.25, 0.06, 0.02) and torch.isfinite(loss)
    assert detector.head.m[3].weight.grad.abs().sum() > 0  # the P6 level is trained


def test_val_on_rect_batches_for_stride_64(p6_model, shapes, tmp_path):
    criterion = YoloLoss(p6_model, rect_training=True)
    metrics = val(p6_model, str(shapes), img_size=128, batch_size=2, workers=0, criterion=criterion,
                  save_dir=tmp_path, verbose=False)
    assert np.isfinite(metrics.map) and len(metrics.loss) == 3 and all(map(np.isfinite, metrics.loss.values()))
    assert (tmp_path / "confusion_matrix.png").is_file()


def test_predict_pads_to_stride_64_and_maps_boxes_back(p6_model, tmp_path):
    image = np.full((100, 150, 3), 114, np.uint8)
    image[20:80, 30:90] = (0, 0, 255)
    predictor = Predictor(p6_model, img_size=128, conf=0.0)
    assert predictor.stride == 64
    (result,) = predict(p6_model, image, img_size=128, conf=0.0, save_dir=tmp_path / "out", save_txt=True)
    assert len(result.boxes) > 0
    boxes = result.boxes
    assert (boxes[:, 0] >= 0).all() and (boxes[:, 2] <= 150).all() and (boxes[:, 3] <= 100).all()
    assert (tmp_path / "out" / "labels" / "image0.txt").is_file()


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None,
                    reason="ONNX export needs the 'export' extra")
@pytest.mark.parametrize("raw", [False, True], ids=["decoded", "raw"])
def test_onnx_export_of_p6_runs_like_torch(p6_model, tmp_path, raw):
    import onnx

    from yolotrain.interop import OnnxModel, export

    path = export(p6_model, "onnx", out=tmp_path / "n6.onnx", img_size=128, dynamic_size=True, raw=raw)
    proto = onnx.load(str(path))
    outputs = [o.name for o in proto.graph.output]
    assert outputs == (["p3", "p4", "p5", "p6"] if raw else ["output0"])
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["strides"]) == [8, 16, 32, 64] and meta["stride"] == "64" and meta["model"] == "yolov5n6"
    imgs = torch.rand(1, 3, 192, 128)
    with torch.no_grad():
        expected = copy.deepcopy(p6_model).fuse()(imgs)
    actual = OnnxModel(path)(imgs)
    assert actual.shape == expected.shape == (1, 3 * sum((192 // s) * (128 // s) for s in (8, 16, 32, 64)), 7)
    torch.testing.assert_close(actual[..., 4:], expected[..., 4:], atol=1e-4, rtol=0)
    torch.testing.assert_close(actual[..., :4], expected[..., :4], atol=1e-3, rtol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("onnx") is None, reason="ONNX export needs the 'export' extra")
def test_cli_export_of_a_p6_checkpoint(p6_model, tmp_path, capsys):
    from yolotrain.cli import main

    weights = save_checkpoint(tmp_path / "best", p6_model)
    assert main(["export", "--weights", str(weights), "--img-size", "128", "--no-simplify"]) == 0
    assert Path(capsys.readouterr().out.strip()).is_file()
    assert main(["export", "--weights", str(weights), "--img-size", "96"]) == 1
    assert "img_size must be one or two positive multiples of 64, got [96]" in capsys.readouterr().err


def test_doctor_finds_nothing_in_a_p6_training_step(p6_model):
    detector = copy.deepcopy(p6_model).train()
    criterion = YoloLoss(detector, rect_training=True)
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.4, 0.3]])

    def step() -> None:
        criterion(detector(torch.rand(1, 3, 128, 128)), targets).backward()

    assert check_step(step) == []
    assert lint_paths([str(MODEL_SOURCES)]) == []


def test_bare_p6_state_dict_is_recognised(p6_model, tmp_path):
    from yolotrain.interop import load_model

    path = tmp_path / "weights.pt"
    torch.save(p6_model.state_dict(), path)
    loaded = load_model(path)
    assert (loaded.version, loaded.num_classes, loaded.stride.tolist()) == ("n6", 2, [8.0, 16.0, 32.0, 64.0])
    imgs = torch.rand(1, 3, 128, 64)
    with torch.no_grad():
        assert torch.equal(loaded(imgs), p6_model(imgs))
