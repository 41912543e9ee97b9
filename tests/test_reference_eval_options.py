"""The reference's val.py and detect.py command lines run after renaming the program (``val``,
``predict``): every option their ``parse_opt`` defines is accepted by the generated command line with
the same meaning, or stops the command in one line saying why, and is then listed in
docs/coming-from-yolov5.md."""

from __future__ import annotations

import inspect
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from test_reference_options import YOLOV5_PAGE, reference_options

from yolotrain import Yolov5
from yolotrain.checkpoint import save_checkpoint
from yolotrain.cli import build_parser, main
from yolotrain.eval import val
from yolotrain.eval.val import UNSUPPORTED_VAL_OPTIONS, ValConfig, val_config
from yolotrain.prediction import predict
from yolotrain.prediction.run import UNSUPPORTED_PREDICT_OPTIONS, PredictConfig, predict_config
from yolotrain.settings import flat_values

# A value for each reference option that takes one, unlike yolotrain's default so the effect shows.
VAL_VALUES = {"--data": "data.yaml", "--weights": "w.pt", "--batch-size": "8", "--imgsz": "320", "--img": "320",
              "--img-size": "320", "--conf-thres": "0.01", "--iou-thres": "0.5", "--max-det": "100",
              "--task": "speed", "--device": "cpu", "--workers": "3", "--project": "elsewhere", "--name": "trial"}
VAL_SAME_MEANING = {
    "--data": ("data", "data.yaml"), "--weights": ("weights", ("w.pt",)), "--batch-size": ("batch_size", 8),
    "--imgsz": ("img_size", 320), "--img": ("img_size", 320), "--img-size": ("img_size", 320),
    "--conf-thres": ("nms.conf", 0.01), "--iou-thres": ("nms.iou", 0.5), "--max-det": ("nms.max_det", 100),
    "--task": ("mode", "speed"), "--device": ("device", "cpu"), "--workers": ("workers", 3),
    "--single-cls": ("single_cls", True), "--save-txt": ("save_txt", True), "--save-conf": ("save_conf", True),
    "--save-json": ("save_json", True), "--project": ("project", "elsewhere"), "--name": ("name", "trial"),
    "--exist-ok": ("exist_ok", True), "--half": ("half", True),
    "--augment": ("augment", True),
}
PREDICT_VALUES = {"--weights": "w.pt", "--source": "img.jpg", "--imgsz": "320", "--img": "320", "--img-size": "320",
                  "--conf-thres": "0.5", "--iou-thres": "0.3", "--max-det": "10", "--device": "cpu", "--classes": "2",
                  "--project": "elsewhere", "--name": "trial", "--line-thickness": "5", "--vid-stride": "2"}
PREDICT_SAME_MEANING = {
    "--weights": ("weights", ("w.pt",)), "--source": ("source", ("img.jpg",)), "--imgsz": ("img_size", 320),
    "--img": ("img_size", 320), "--img-size": ("img_size", 320), "--conf-thres": ("nms.conf", 0.5),
    "--iou-thres": ("nms.iou", 0.3), "--max-det": ("nms.max_det", 10), "--device": ("device", "cpu"),
    "--view-img": ("view_img", True), "--save-txt": ("save_txt", True), "--save-crop": ("save_crop", True),
    "--nosave": ("save", False), "--classes": ("nms.classes", (2,)), "--agnostic-nms": ("nms.agnostic", True),
    "--project": ("project", "elsewhere"), "--name": ("name", "trial"), "--exist-ok": ("exist_ok", True),
    "--line-thickness": ("line_width", 5), "--hide-labels": ("hide_labels", True),
    "--hide-conf": ("hide_conf", True), "--half": ("half", True), "--vid-stride": ("vid_stride", 2),
    "--augment": ("augment", True),
    "--visualize": ("visualize", True),
}
# Accepted and changing nothing: val always prints the per-class table, predict's label rows always end
# with the score.
AS_IS = {"val": {"--verbose"}, "predict": {"--save-conf"}}
# The inputs every parse needs (a later copy of the option wins).
REQUIRED = {"val": ["--weights", "w.pt", "--data", "data.yaml"], "predict": ["--weights", "w.pt", "--source", "x.jpg"]}
COMMANDS = {
    "val": ("val.py", VAL_VALUES, VAL_SAME_MEANING, UNSUPPORTED_VAL_OPTIONS, val_config, ValConfig),
    "predict": ("detect.py", PREDICT_VALUES, PREDICT_SAME_MEANING, UNSUPPORTED_PREDICT_OPTIONS, predict_config,
                PredictConfig),
}


def _cases(kind: str) -> list[tuple[str, str]]:
    return [(command, flag) for command, spec in COMMANDS.items()
            for flag in sorted(spec[2] if kind == "same" else spec[3])]


def _option(command: str, flag: str) -> list[str]:
    script, values = COMMANDS[command][:2]
    return [flag, *dict(reference_options(script, values))[flag]]


# Settings that say what to run on and where the run folder goes, not keywords of val() and predict().
RUN_ONLY = {"weights", "data", "source", "project", "name", "exist_ok"}


@pytest.mark.parametrize(("function", "config"), [(val, ValConfig()), (predict, PredictConfig())])
def test_python_api_takes_every_setting_with_its_default(function, config):
    parameters = inspect.signature(function).parameters
    settings = {k: v for k, v in flat_values(config).items() if k not in RUN_ONLY}
    if function is val:  # val scores every class
        assert (settings.pop("classes"), settings.pop("agnostic")) == (None, False)
    assert {name: parameters[name].default for name in settings} == settings


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_reference_option_is_classified_and_documented(command):
    script, values, same, refused = COMMANDS[command][:4]
    flags = {flag for flag, _ in reference_options(script, values)}
    assert len(flags) > 20
    assert flags == set(same) | set(refused) | AS_IS[command]
    coming_from = YOLOV5_PAGE.read_text()  # the page: the train, val/detect and export sections
    for flag in refused:
        assert f"`{flag}`" in coming_from, flag


@pytest.mark.parametrize(("command", "flag"), _cases("same"))
def test_reference_option_has_the_same_meaning(command, flag):
    args = build_parser().parse_args([command, *REQUIRED[command], *_option(command, flag)])
    config = COMMANDS[command][4](args)
    path, expected = COMMANDS[command][2][flag]
    for part in path.split("."):
        config = getattr(config, part)
    assert config == pytest.approx(expected) if isinstance(expected, float) else config == expected


# The IoU threshold not given is None on either command: the model family's, chosen once the model is loaded
# (YOLOv5's 0.6 to validate and 0.45 to predict, tests/test_anchor_free_val.py).
@pytest.mark.parametrize(("command", "expected"), [("val", (0.01, None, 300)), ("predict", (0.01, None, 1000))])
def test_one_nms_option_keeps_the_commands_other_defaults(command, expected):
    config = COMMANDS[command][4](build_parser().parse_args([command, *REQUIRED[command], "--conf-thres", "0.01"]))
    assert (config.nms.conf, config.nms.iou, config.nms.max_det) == expected


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_options_accepted_as_they_are_change_nothing(command):
    make_config = COMMANDS[command][4]
    plain = make_config(build_parser().parse_args([command, *REQUIRED[command]]))
    for flag in AS_IS[command]:
        assert make_config(build_parser().parse_args([command, *REQUIRED[command], flag])) == plain


@pytest.mark.parametrize(("command", "flag"), _cases("refused"))
def test_unsupported_reference_option_stops_in_one_line(command, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([command, *REQUIRED[command], *_option(command, flag)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"yolotrain {command}: error: {flag} is not supported: {COMMANDS[command][3][flag]}"
    assert not any(tmp_path.iterdir())  # nothing was started


@pytest.mark.parametrize(("command", "options", "message"), [
    ("val", ["--weights", "a.pt", "b.onnx"], "an ensemble (several --weights) runs PyTorch models"),
    ("predict", ["--weights", "a.pt", "b.onnx"], "an ensemble (several --weights) runs PyTorch models"),
    ("predict", ["--imgsz", "640", "480"], "--imgsz 640 480: only square inputs"),
])
def test_reference_values_yolotrain_lacks_are_one_line(command, options, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([command, *REQUIRED[command], *options]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not any(tmp_path.iterdir())


def test_view_img_without_a_display_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--weights", "missing.pt", "--source", "x.jpg", "--view-img"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("yolotrain predict: error: --view-img cannot show a window: ")
    assert "no window support" in err or "no display" in err


def test_view_img_with_a_headless_opencv_is_one_line(tmp_path, monkeypatch, capsys):
    # What opencv-python-headless reports about its window support, on a machine with a display.
    monkeypatch.setattr(cv2, "getBuildInformation", lambda: "  GUI:                           NONE\n")
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--weights", "missing.pt", "--source", "x.jpg", "--view-img"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("yolotrain predict: error: --view-img cannot show a window: this OpenCV has no window support "
                   "(opencv-python-headless); install opencv-python for it, or leave --view-img out")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, Path]:
    """A random-init two-class checkpoint and a two-image shapes dataset's YAML."""
    from yolotrain.data import generate_shapes_dataset

    root = tmp_path_factory.mktemp("reference_lines")
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2).eval()
    model.names = ["circle", "rectangle"]
    data = generate_shapes_dataset(root=root / "shapes", n_train=2, n_val=2, img_size=64) / "data.yaml"
    return save_checkpoint(root / "weights" / "tiny", model), data


def test_reference_val_command_line_runs(tiny_run, tmp_path, capsys):
    weights, data = tiny_run
    line = (f"--data {data} --weights {weights} --batch-size 2 --imgsz 64 --conf-thres 0.001 --iou-thres 0.6 "
            f"--max-det 300 --task val --device cpu --workers 0 --single-cls --verbose --save-txt --save-conf "
            f"--project {tmp_path / 'runs'} --name exp --exist-ok").split()
    assert main(["val", *line]) == 0
    labels = sorted((tmp_path / "runs" / "exp" / "labels").glob("*.txt"))
    assert len(labels) == 2
    rows = [row.split() for f in labels for row in f.read_text().splitlines()]
    assert rows and all(len(row) == 6 and row[0] == "0" for row in rows)  # one class, a confidence column
    assert "Results saved to" in capsys.readouterr().out


def test_reference_detect_command_line_runs_as_predict(tiny_run, tmp_path, capsys):
    image = tmp_path / "scene.jpg"
    cv2.imwrite(str(image), np.tile(np.linspace(0, 255, 96, dtype=np.uint8), (64, 1))[..., None].repeat(3, 2))
    weights, _ = tiny_run
    line = (f"--weights {weights} --source {image} --imgsz 64 64 --conf-thres 0.001 --iou-thres 0.45 --max-det 4 "
            f"--device cpu --save-txt --save-conf --save-crop --nosave --classes 0 1 --agnostic-nms "
            f"--line-thickness 2 --hide-labels --hide-conf --vid-stride 1 --project {tmp_path / 'runs'} --name exp "
            f"--exist-ok").split()
    assert main(["predict", *line]) == 0
    run = tmp_path / "runs" / "exp"
    rows = (run / "labels" / "scene.txt").read_text().splitlines()
    assert 1 <= len(rows) <= 4 and all(len(row.split()) == 6 for row in rows)  # --max-det, scores
    assert list(run.glob("crops/*/scene*.jpg"))
    assert not (run / "scene.jpg").exists()  # --nosave: no annotated image
    assert "1 images/frames" in capsys.readouterr().out
