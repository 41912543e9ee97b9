"""The reference's ``detect.py --visualize`` (each layer's feature maps per predicted image) and ``train.py
--bbox_interval`` (W&B images of validation predictions with their boxes every N epochs)."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch

from yolotrain import Yolov5
from yolotrain.checkpoint import save_checkpoint
from yolotrain.cli import main
from yolotrain.eval import predict
from yolotrain.eval.visualize import MAX_CHANNELS
from yolotrain.model.classify import Classifier

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


def test_visualize_needs_a_folder_to_write_into(tmp_path):
    with pytest.raises(ValueError, match="visualize writes the feature maps into save_dir"):
        predict(Yolov5("n", num_classes=2).eval(), _image(), visualize=True)


def test_visualize_refuses_an_export_in_one_line(tmp_path):
    pytest.importorskip("onnxruntime")
    from yolotrain.interop.export import export

    path = export(Yolov5("n", num_classes=2), "onnx", out=tmp_path / "tiny.onnx", img_size=64, simplify=False)
    with pytest.raises(ValueError, match=r"^--visualize looks into the layers of a PyTorch model; this ONNX export has "
                                         "none to look into"):
        predict(path, _image(), save_dir=tmp_path / "run", visualize=True)
    assert not (tmp_path / "run").exists()
