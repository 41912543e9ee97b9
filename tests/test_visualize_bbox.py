"""The reference's ``detect.py --visualize`` (each layer's feature maps per predicted image) and ``train.py
--bbox_interval`` (W&B images of validation predictions with their boxes every N epochs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolotrain import Yolov5, train
from yolotrain.checkpoint import save_checkpoint
from yolotrain.cli import build_parser, main, train_settings
from yolotrain.engine import resolve_config
from yolotrain.engine.loggers import box_interval
from yolotrain.model.classify import Classifier
from yolotrain.prediction import predict
from yolotrain.prediction.visualize import MAX_CHANNELS
from yolotrain.settings import ConfigError

# The layers of yolov5n (and every published YOLOv5 P5 layout) before its head, as the reference's
# feature_visualization names their files: stage{m.i}_{type(m).__name__}.
YOLOV5_P5_LAYERS = ["Conv", "Conv", "C3", "Conv", "C3", "Conv", "C3", "Conv", "C3", "SPPF", "Conv", "Upsample",
                    "Concat", "C3", "Conv", "Upsample", "Concat", "C3", "Conv", "Concat", "C3", "Conv", "Concat",
                    "C3"]
# A YOLOv5 classifier: the backbone's first 9 layers (the reference's cutoff 10), then its Classify head.
YOLOV5_CLS_LAYERS = YOLOV5_P5_LAYERS[:9]


def _image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (48, 80, 3), dtype=np.uint8)


def _layer_outputs(record: dict[int, torch.Tensor]):
    """An ``on_predict_start`` callback hooking every layer of the model predict runs (its own fused copy),
    recording each layer's output of the latest forward by its index."""
    def hook_layers(predictor) -> None:
        for index, layer in enumerate(predictor.model.model.children()):
            layer.register_forward_hook(lambda m, i, out, index=index: record.__setitem__(index, out.clone())
                                        if isinstance(out, torch.Tensor) else None)
    return hook_layers


@pytest.mark.parametrize(("make", "layers"), [
    (lambda: Yolov5("n", num_classes=2), YOLOV5_P5_LAYERS),
    (lambda: Yolov5("n", num_classes=2, task="segment"), YOLOV5_P5_LAYERS),
    (lambda: Classifier.from_name("yolov5n-cls", num_classes=3), YOLOV5_CLS_LAYERS),
], ids=["detect", "segment", "classify"])
def test_visualize_saves_each_layers_maps_under_the_references_names(make, layers, tmp_path):
    torch.manual_seed(0)
    model = make().eval()
    outputs: dict[int, torch.Tensor] = {}
    predict(model, [_image()], img_size=64, half=False, save_dir=tmp_path / "run", visualize=True,
            callbacks={"on_predict_start": _layer_outputs(outputs)})
    folder = tmp_path / "run" / "image0"
    expected = {f"stage{i}_{name}_features{suffix}" for i, name in enumerate(layers) for suffix in (".png", ".npy")}
    assert {p.name for p in folder.iterdir()} == expected
    for i, name in enumerate(layers):
        saved = np.load(folder / f"stage{i}_{name}_features.npy")
        layer_output = outputs[i][0].float().numpy()  # the first image's channels, all of them
        assert saved.dtype == np.float32 and saved.shape == layer_output.shape
        np.testing.assert_array_equal(saved, layer_output)
        grid = cv2.imread(str(folder / f"stage{i}_{name}_features.png"))
        assert grid is not None and grid.ndim == 3
        rows = math.ceil(min(MAX_CHANNELS, saved.shape[0]) / 8)
        assert grid.shape[0] * 8 == pytest.approx(grid.shape[1] * rows, rel=0.05)  # 8 tiles a row


def test_visualize_folders_follow_the_output_stems_of_images_and_video_frames(tmp_path):
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2).eval()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        cv2.imwrite(str(tmp_path / name / "x.jpg"), _image())
    video = cv2.VideoWriter(str(tmp_path / "clip.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 5, (80, 48))
    for seed in range(2):
        video.write(_image(seed))
    video.release()
    predict(model, [tmp_path / "a" / "x.jpg", tmp_path / "b" / "x.jpg", tmp_path / "clip.mp4"], img_size=64,
            half=False, save_dir=tmp_path / "run", visualize=True)
    for stem in ("x", "x_2", "clip_0", "clip_1"):  # as the images' and frames' labels/STEM.txt are named
        assert (tmp_path / "run" / stem / "stage23_C3_features.npy").is_file(), stem
    # Each frame's maps are its own.
    first, second = (np.load(tmp_path / "run" / f"clip_{n}" / "stage0_Conv_features.npy") for n in (0, 1))
    assert not np.array_equal(first, second)


def test_visualize_on_the_command_line(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    weights = save_checkpoint(tmp_path / "tiny", Yolov5("n", num_classes=2))
    cv2.imwrite(str(tmp_path / "bus.jpg"), _image())
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--weights", str(weights), "--source", "bus.jpg", "--imgsz", "64", "--visualize"]) == 0
    grid = cv2.imread(str(tmp_path / "runs" / "predict" / "exp" / "bus" / "stage9_SPPF_features.png"))
    assert grid is not None


def test_the_yolo_object_makes_a_run_folder_for_visualize(tmp_path):
    from yolotrain import YOLO

    YOLO("yolov5n").predict(_image(), visualize=True, img_size=64, half=False, project=str(tmp_path / "runs"))
    assert (tmp_path / "runs" / "exp" / "image0" / "stage9_SPPF_features.npy").is_file()


def test_visualize_needs_a_folder_to_write_into(tmp_path):
    with pytest.raises(ValueError, match="visualize writes the feature maps into save_dir"):
        predict(Yolov5("n", num_classes=2).eval(), _image(), visualize=True)


def test_visualize_refuses_an_export_in_one_line(tmp_path):
    pytest.importorskip("onnxruntime")
    from yolotrain.interop.exporting.exporter import export

    path = export(Yolov5("n", num_classes=2), "onnx", out=tmp_path / "tiny.onnx", img_size=64, simplify=False)
    with pytest.raises(ValueError, match=r"^--visualize looks into the layers of a PyTorch model; this ONNX export has "
                                         "none to look into"):
        predict(path, _image(), save_dir=tmp_path / "run", visualize=True)
    assert not (tmp_path / "run").exists()


def test_visualize_with_augment_or_an_ensemble_is_one_line(tmp_path):
    model = Yolov5("n", num_classes=2).eval()
    with pytest.raises(ValueError, match="^--visualize shows one model's layers .* with test-time augmentation"):
        predict(model, _image(), save_dir=tmp_path / "run", visualize=True, augment=True)
    with pytest.raises(ValueError, match="^--visualize shows one model's layers .* with an ensemble"):
        predict([model, model], _image(), save_dir=tmp_path / "run", visualize=True)
    assert not (tmp_path / "run").exists()


def _train_offline_wandb(tmp_path, monkeypatch, **settings):
    """A tiny run logged to an offline W&B run in ``tmp_path``; its result, its run folder and the history
    rows of its run file by step."""
    wandb = pytest.importorskip("wandb")
    from test_loggers import _shapes, _wandb_records

    for name in ("DIR", "CONFIG_DIR", "CACHE_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        monkeypatch.setenv(f"WANDB_{name}", str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()  # W&B keeps the settings of its first run in the process: these must be read afresh
    run = train(data=str(_shapes(tmp_path)), img_size=64, batch_size=4, workers=0, autoanchor=False,
                tensorboard=False, loggers=("wandb",), project=str(tmp_path / "runs"), **settings)
    wandb.teardown()  # the W&B service writes the run file in the background; this waits for it
    (run_file,) = (run.save_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history: dict[int, dict] = {}
    for record in _wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            values = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                      for item in record.history.item}
            history[int(values["_step"])] = values
    return run, run_file.parent, history


def test_wandb_logs_validation_images_with_boxes_every_bbox_interval_epochs(tmp_path, monkeypatch):
    detections: dict[int, dict[str, torch.Tensor]] = {}  # what each epoch's validation found, by image name
    epoch = [0]
    callbacks = {"on_train_epoch_end": lambda trainer, e: epoch.__setitem__(0, e + 1),
                 "on_val_image_end": lambda path, det: detections.setdefault(epoch[0], {}).__setitem__(
                     Path(path).name, det.clone())}
    # Under --noplots an explicit interval still logs (the reference turns off only its automatic one).
    run, folder, history = _train_offline_wandb(tmp_path, monkeypatch, epochs=2, bbox_interval=2, plots=False,
                                                callbacks=callbacks)
    key = "Bounding Box Debugger/Images"
    assert sorted(history) == [1, 2]
    assert not any(k.startswith(key) for k in history[1])  # epoch 1 is not a multiple of 2
    logged = history[2]
    names = sorted(detections[2])
    assert logged[f"{key}/_type"] == "images/separated" and logged[f"{key}/count"] == len(names) == 4
    assert logged[f"{key}/captions"] == names  # the validation images, in order
    for name, image_file, boxes in zip(names, logged[f"{key}/filenames"], logged[f"{key}/all_boxes"]):
        image = cv2.imread(str(folder / "files" / image_file))
        assert image is not None and image.shape[:2] == (64, 64)
        predictions = json.loads((folder / "files" / boxes["predictions"]["path"]).read_text())
        assert predictions["class_labels"] == {"0": "circle", "1": "rectangle"}
        det = detections[2][name]
        assert len(predictions["box_data"]) == len(det) > 0
        for box, (x1, y1, x2, y2, conf, c) in zip(predictions["box_data"], det[:, :6].tolist()):
            position = box["position"]
            assert [position[k] for k in ("minX", "minY", "maxX", "maxY")] == pytest.approx([x1, y1, x2, y2])
            assert box["class_id"] == int(c) and box["domain"] == "pixel"
            assert box["box_caption"] == f"{('circle', 'rectangle')[int(c)]} {conf:.3f}"
    assert run.epochs_run == 2


@pytest.mark.parametrize(("bbox_interval", "epochs", "plots", "interval"), [
    (-1, 30, True, 3), (-1, 10, True, 1), (-1, 5, True, 1), (-1, 30, False, 0), (4, 30, False, 4), (0, 30, True, 0),
])
def test_bbox_interval_follows_the_reference(bbox_interval, epochs, plots, interval):
    assert box_interval(bbox_interval, epochs, plots) == interval


def test_bbox_interval_on_the_command_line():
    for flag in ("--bbox_interval", "--bbox-interval"):
        args = build_parser().parse_args(["train", flag, "5"])
        assert resolve_config(**train_settings(args)).bbox_interval == 5
    with pytest.raises(ConfigError, match="bbox_interval"):
        resolve_config(bbox_interval=-2)
