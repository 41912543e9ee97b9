"""The pictures a run leaves for a look by eye (labels.jpg at the start of training, val_batch*_labels/pred.jpg at
the final validation and from `yolotrain val`), the model summary of `train` and `yolotrain info`, and the
progress bars of val, predict, track, export and data check (stderr, training's style; shown on a terminal, and
here, where stderr is captured, because YOLOTRAIN_PROGRESS=1 asks for them)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolotrain import Yolov5, train, val
from yolotrain.checkpoint import save_checkpoint
from yolotrain.cli import main
from yolotrain.data import generate_shapes_dataset
from yolotrain.data.classify import write_shape_crops
from yolotrain.draw import draw_batch
from yolotrain.eval.plots import save_val_batch
from yolotrain.eval.val import build_val_loader
from yolotrain.model.summary import summarise

TINY = {"img_size": 64, "batch_size": 4, "workers": 0, "device": "cpu", "autoanchor": False}
NAMES = ["circle", "rectangle"]


def picture(path: Path, shape: tuple[int, int, int] | None = None) -> np.ndarray:
    """The image at ``path``, checked to be a readable picture (of ``shape``) that is not blank."""
    image = cv2.imread(str(path))
    assert image is not None, f"{path} is not a readable image"
    if shape is not None:
        assert image.shape == shape, f"{path}: {image.shape}, expected {shape}"
    assert image.std() > 10 and len(np.unique(image.reshape(-1, 3), axis=0)) > 50, f"{path} is blank"
    return image


def bar_of(stderr: str, desc: str) -> str:
    """The last state of the progress bar named ``desc`` in tqdm's output."""
    states = [s for s in re.split(r"[\r\n]", stderr) if s.startswith(f"{desc}:")]
    assert states, f"no {desc!r} progress bar in {stderr!r}"
    return states[-1]


@pytest.fixture(autouse=True)
def bars_shown(monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_PROGRESS", "1")


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2).eval()
    model.names = list(NAMES)
    return save_checkpoint(tmp_path_factory.mktemp("weights") / "tiny", model)


def test_training_draws_labels_and_validation_batches_and_prints_the_summary(tiny_data, tmp_path, capsys):
    result = train(data=str(tiny_data), model="yolov5n", epochs=1, project=str(tmp_path), **TINY)
    out, err = capsys.readouterr()
    line = str(summarise(Yolov5("n", num_classes=2), "yolov5n", 64))
    assert line.startswith("yolov5n summary: ") and line in out
    assert re.search(r"yolov5n summary: \d+ layers, [\d,]+ parameters, [\d,]+ gradients, [\d.]+ GFLOPs", out)
    # instances per class, box centres, box sizes: three panels of matplotlib at 100 dpi
    picture(result.save_dir / "labels.jpg", (450, 1600, 3))
    # the 4 validation images are one batch (rectangular, padded as the reference pads them): two by two
    imgs, targets = next(iter(build_val_loader(tiny_data, 2, 64, 32, workers=0)))
    boxes = cv2.imdecode(cv2.imencode(".jpg", draw_batch(imgs, targets, NAMES))[1], cv2.IMREAD_COLOR)
    side = 2 * imgs.shape[-1]
    labels = picture(result.save_dir / "val_batch0_labels.jpg", (side, side, 3))
    picture(result.save_dir / "val_batch0_pred.jpg", (side, side, 3))
    assert not (result.save_dir / "val_batch1_labels.jpg").exists()
    assert np.abs(labels.astype(int) - boxes).mean() < 2  # the validation labels, drawn as training batches are
    assert any(s.startswith("1/1 ") and "100%" in s for s in re.split(r"[\r\n]", err))  # training's bar
    assert "100%" in bar_of(err, "val") and "1/1" in bar_of(err, "val")


def test_the_prediction_picture_shows_the_detections_scoring_at_least_a_quarter(tmp_path):
    imgs = torch.full((2, 3, 64, 64), 90, dtype=torch.uint8)
    imgs[1, :, 20:40, 20:40] = 200
    targets = torch.tensor([[1.0, 1, 0.47, 0.47, 0.3, 0.3]])
    dets = [torch.tensor([[10.0, 10, 40, 40, 0.9, 1], [5, 5, 20, 20, 0.1, 0]]), torch.zeros(0, 6)]
    labels_path, pred_path = save_val_batch(tmp_path, 0, imgs, targets, dets, NAMES)
    assert (labels_path.name, pred_path.name) == ("val_batch0_labels.jpg", "val_batch0_pred.jpg")
    confident = torch.tensor([[0.0, 1, 25 / 64, 25 / 64, 30 / 64, 30 / 64, 0.9]])
    expected = cv2.imdecode(cv2.imencode(".jpg", draw_batch(imgs, confident, NAMES))[1], cv2.IMREAD_COLOR)
    assert np.array_equal(cv2.imread(str(pred_path)), expected)
    expected = cv2.imdecode(cv2.imencode(".jpg", draw_batch(imgs, targets, NAMES))[1], cv2.IMREAD_COLOR)
    assert np.array_equal(cv2.imread(str(labels_path)), expected)


def test_segmentation_validation_pictures_show_the_label_masks(tmp_path, capsys):
    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=4, n_val=4, img_size=64) / "data.yaml"
    torch.manual_seed(0)
    model = Yolov5("n-seg", num_classes=2).eval()
    val(model, str(data), img_size=64, workers=0, device="cpu", save_dir=tmp_path / "run", verbose=False)
    imgs, targets = next(iter(build_val_loader(data, 2, 64, 32, workers=0, kind="masks")))
    boxes_only = draw_batch(imgs, targets, NAMES)
    labels = picture(tmp_path / "run" / "val_batch0_labels.jpg", boxes_only.shape)
    picture(tmp_path / "run" / "val_batch0_pred.jpg", boxes_only.shape)
    smooth = [cv2.GaussianBlur(p, (7, 7), 0).astype(int) for p in (labels, boxes_only)]
    assert (abs(smooth[0] - smooth[1]).max(2) > 25).mean() > 0.01  # the masks are blended in (in 96 px rect tiles)
    assert "100%" in bar_of(capsys.readouterr().err, "val")


def test_a_classifier_run_draws_its_class_counts_and_validation_batches(tmp_path):
    crops = write_shape_crops(tmp_path / "shapes-cls", n_train=6, n_val=3)
    result = train(data=str(crops), model="yolov5n-cls", epochs=1, project=str(tmp_path / "runs"), img_size=32,
                   batch_size=8, workers=0, device="cpu")
    picture(result.save_dir / "labels.jpg")
    # 6 validation crops of 32 px: a grid of three by three, the last three places grey
    labels = picture(result.save_dir / "val_batch0_labels.jpg", (96, 96, 3))
    pred = picture(result.save_dir / "val_batch0_pred.jpg", (96, 96, 3))
    assert not np.array_equal(labels, pred)  # the predictions name their probability too


def test_yolotrain_val_draws_the_batches_and_shows_its_bar(weights, tiny_data, tmp_path, capsys):
    code = main(["val", "--weights", str(weights), "--data", str(tiny_data), "--img", "64", "--batch-size", "2",
                 "--workers", "0", "--device", "cpu", "--project", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0, err
    for i in range(2):  # 4 images, 2 per batch side by side
        for kind in ("labels", "pred"):
            image = picture(tmp_path / "exp" / f"val_batch{i}_{kind}.jpg")
            assert image.shape[1] == 2 * image.shape[0]
    assert "2/2" in bar_of(err, "val") and "100%" in bar_of(err, "val")


@pytest.mark.parametrize("setting", ["0", None])
def test_the_bars_are_hidden_by_yolotrain_progress_0_and_off_a_terminal(weights, tiny_data, monkeypatch, capsys,
                                                                         setting):
    if setting is None:
        monkeypatch.delenv("YOLOTRAIN_PROGRESS")
    else:
        monkeypatch.setenv("YOLOTRAIN_PROGRESS", setting)
    val(str(weights), str(tiny_data), img_size=64, workers=0, device="cpu", verbose=False)
    assert "val:" not in capsys.readouterr().err


def test_a_terminal_shows_the_bar_without_being_asked(tiny_data, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "YOLOTRAIN_PROGRESS"}
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal 120 columns wide
    with subprocess.Popen([sys.executable, "-m", "yolotrain", "data", "check", str(tiny_data), "--out",
                           str(tmp_path / "check"), "--img", "64"], stderr=follower, stdout=subprocess.PIPE,
                          env=env) as process:
        os.close(follower)
        received = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal's other side closed: the command is done
                break
            if not chunk:
                break
            received += chunk
        assert process.wait(timeout=300) == 0
    os.close(leader)
    assert "100%" in bar_of(received.decode(errors="replace"), "data check")


def test_predict_shows_a_bar_and_a_line_per_image_with_verbose(weights, tiny_data, tmp_path, capsys):
    images = tiny_data.parent / "images" / "val"
    code = main(["predict", "--weights", str(weights), "--source", str(images), "--img", "64", "--conf", "0.001",
                 "--device", "cpu", "--project", str(tmp_path), "--verbose"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "4/4" in bar_of(err, "predict") and "100%" in bar_of(err, "predict")
    for path in sorted(images.iterdir()):
        assert re.search(rf"^{re.escape(str(path))}: (\d+ (circle|rectangle)s?(, )?)+$", out, re.M), out
    main(["predict", "--weights", str(weights), "--source", str(images), "--img", "64", "--device", "cpu",
          "--project", str(tmp_path)])
    out, err = capsys.readouterr()
    assert str(images) not in out and "4/4" in bar_of(err, "predict")


def test_track_shows_a_bar_per_frame(weights, tiny_data, tmp_path, capsys):
    pytest.importorskip("lap")
    code = main(["track", "--weights", str(weights), "--source", str(tiny_data.parent / "images" / "val"),
                 "--img", "64", "--device", "cpu", "--project", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "4/4" in bar_of(err, "track") and "100%" in bar_of(err, "track")


def test_export_shows_a_bar_over_its_formats(weights, tmp_path, capsys):
    code = main(["export", "--weights", str(weights), "--format", "torchscript", "--img", "64",
                 "--output", str(tmp_path / "m.torchscript")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "1/1" in bar_of(err, "export") and str(tmp_path / "m.torchscript") in out


def test_data_check_shows_a_bar_and_draws_the_label_statistics(tiny_data, tmp_path, capsys):
    assert main(["data", "check", str(tiny_data), "--out", str(tmp_path / "check"), "--img", "64"]) == 0
    out, err = capsys.readouterr()
    assert "3/3" in bar_of(err, "data check") and "100%" in bar_of(err, "data check")
    assert "label_stats.png" in out
    picture(tmp_path / "check" / "label_stats.png", (450, 1600, 3))


def test_info_prints_the_summary_and_with_verbose_the_layers(capsys):
    assert main(["info", "yolov5n", "--img", "64"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(summarise(Yolov5("n"), "yolov5n", 64))
    assert main(["info", "yolov5n", "--img", "64", "--verbose"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == out and len(lines) == 1 + 25 + 1  # a header, the 25 layers, the summary
    assert re.match(r"\s+24\s+\[17, 20, -1\]\s+[\d,]+\s+Detect\s+\[\[1, 3, 8, 8, 85\]", lines[-2])
    assert main(["info", "nope"]) == 1
    assert capsys.readouterr().err.startswith("yolotrain info: error: unknown YOLOv5 version 'nope'")
