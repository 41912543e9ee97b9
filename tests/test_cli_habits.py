"""The command line as people type it: ``--model ARCH --weights FILE`` starts an architecture from weights,
options are spelt in full and a misspelt one gets the closest, ``--version``, ``key=value`` settings, and
choices in any case."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import YOLOV5N_WEIGHTS

import yolotrain
from yolotrain.cli import build_parser, main, train_settings
from yolotrain.data import generate_shapes_dataset
from yolotrain.engine import resolve_config
from yolotrain.interop import load_checkpoint, load_model
from yolotrain.model.segment import Segment

TINY = ["--epochs", "1", "--img", "64", "--batch", "4", "--workers", "0", "--device", "cpu", "--noautoanchor",
        "--noval"]
BACKBONE = tuple(f"model.{i}." for i in range(10))


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=8, n_val=4, img_size=64) / \
        "data.yaml"


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def assert_started_from(run: Path, weights: torch.nn.Module, out: str) -> None:
    """The run's model is a segmentation model whose frozen backbone holds ``weights``' tensors, and the run
    said how many tensors it took over."""
    model, _ = load_checkpoint(run / "weights" / "last", use_ema=False)
    assert isinstance(model.head, Segment) and model.task == "segment"
    theirs = weights.state_dict()
    backbone = [(name, p) for name, p in model.named_parameters() if name.startswith(BACKBONE)]
    assert len(backbone) > 50
    for name, param in backbone:
        assert torch.equal(param, theirs[name].to(param.dtype)), name
    total = len(model.state_dict())
    transferred = re.search(rf"^Transferred (\d+)/{total} tensors from ", out, re.M)
    assert transferred is not None, out
    assert len(backbone) < int(transferred.group(1)) < total  # Proto (at least) starts fresh


def test_model_and_weights_start_the_architecture_from_a_detection_checkpoint(shapes, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["train", "--data", str(shapes), "--model", "yolov5n", *TINY, "--project", str(runs),
                 "--name", "det"]) == 0
    detector = runs / "det" / "weights" / "last"
    capsys.readouterr()
    # The same run in key=value form; --freeze 10 keeps the backbone as the weights started it.
    assert main(["train", f"data={shapes}", "model=yolov5n-seg.yaml", f"weights={detector}", "epochs=1", "imgsz=64",
                 "batch=4", "workers=0", "device=cpu", "autoanchor=false", "val=false", "freeze=10",
                 f"project={runs}", "name=seg"]) == 0
    assert_started_from(runs / "seg", load_model(detector), capsys.readouterr().out)


def test_model_names_the_weights_to_val_predict_and_export(shapes, tmp_path, capsys):
    """Ultralytics' spelling: ``--model FILE`` runs the file in ``val``, ``predict`` and ``export`` as ``--weights``
    does."""
    runs = tmp_path / "runs"
    assert main(["train", "--data", str(shapes), "--model", "yolov8n", *TINY, "--project", str(runs),
                 "--name", "af"]) == 0
    best = runs / "af" / "weights" / "best"
    image = next((shapes.parent / "images" / "val").iterdir())
    capsys.readouterr()
    # Without --data, the dataset the checkpoint was trained on, as Ultralytics' val does.
    assert main(["val", "--model", str(best), "--img", "64", "--project", str(runs)]) == 0
    out = capsys.readouterr().out
    assert f"Data: {shapes} (what {best} was trained on; --data for another)\n" in out and "all" in out
    for flag in ("--model", "--weights"):
        assert main(["predict", flag, str(best), "--source", str(image), "--img", "64", "--project", str(runs),
                     "--name", flag.strip("-"), "--save-txt", "--conf", "0.0001"]) == 0
    labels = [(runs / name / "labels" / f"{image.stem}.txt").read_text() for name in ("model", "weights")]
    assert labels[0] == labels[1] and labels[0]
    assert main(["export", "--model", str(best), "--format", "torchscript", "--img", "64"]) == 0
    assert (runs / "af" / "weights" / "best.torchscript").is_file()


def test_val_without_data_needs_the_dataset_its_checkpoint_names(tmp_path, capsys):
    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=4, n_val=2, img_size=64) / "data.yaml"
    runs = tmp_path / "runs"
    assert main(["train", "--data", str(data), "--model", "yolov5n", *TINY, "--project", str(runs)]) == 0
    best = runs / "exp" / "weights" / "best"
    data.rename(data.with_name("moved.yaml"))
    capsys.readouterr()
    assert main(["val", "--weights", str(best), "--project", str(runs)]) == 1
    assert one_line_error(capsys) == (f"yolotrain val: error: --data is needed: {best} was trained on {data}, which "
                                      "is not here")
    foreign = tmp_path / "foreign.pt"  # no checkpoint set of ours (an official .pt, an export): names no dataset
    assert main(["val", "--weights", str(foreign), "--project", str(runs)]) == 1
    assert one_line_error(capsys) == (f"yolotrain val: error: --data is needed: {foreign} does not name the "
                                      "dataset it was trained on")
    assert sorted(p.name for p in runs.iterdir()) == ["exp"]


@pytest.mark.skipif(not YOLOV5N_WEIGHTS.is_file(), reason="needs ../shared/weights/yolov5n.pt")
def test_model_and_weights_start_a_segmentation_model_from_the_official_detector(shapes, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["train", "--data", str(shapes), "--model", "yolov5n-seg.yaml", "--weights", str(YOLOV5N_WEIGHTS),
                 *TINY, "--freeze", "10", "--project", str(runs), "--name", "seg"]) == 0
    assert_started_from(runs / "seg", load_model(YOLOV5N_WEIGHTS), capsys.readouterr().out)


@pytest.mark.parametrize(("argv", "settings"), [
    (["--weights", "yolov5s.pt"], {"model": "yolov5s.pt"}),  # the reference's: the weights to fine-tune
    (["--model", "yolov5n-seg.yaml", "--weights", "yolov5n.pt"], {"model": "yolov5n-seg", "pretrained": "yolov5n.pt"}),
    (["--weights", "yolov5n.pt", "--model", "yolov5n-seg"], {"model": "yolov5n-seg", "pretrained": "yolov5n.pt"}),
    (["--cfg", "yolov5s-seg.yaml", "--weights", "yolov5s.pt"], {"model": "yolov5s-seg", "pretrained": "yolov5s.pt"}),
    (["--model", "yolov5s6"], {"model": "yolov5s6"}),
    (["--weights", "", "--cfg", "yolov5m.yaml"], {"model": "yolov5m"}),
])
def test_model_options_name_the_architecture_and_its_weights(argv, settings):
    assert train_settings(build_parser().parse_args(["train", *argv])) == settings


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "a.pt", "--weights", "b.pt"], "--model a.pt and --weights b.pt are both weights"),
    (["--model", "yolov5n-seg.yaml", "--weights", "b.pt", "--pretrained", "c.pt"],
     "--weights b.pt and --pretrained c.pt are both weights"),
    (["--cfg", "yolov5s.yaml", "--model", "yolov5n-seg.yaml"],
     "--cfg yolov5s.yaml and --model yolov5n-seg.yaml both name an architecture"),
    (["--model", "yolov5n-seg", "--weights", "yolov5n.yaml"],
     "--model yolov5n-seg and --weights yolov5n.yaml both name an architecture"),
])
def test_contradicting_model_options_stop_in_one_line(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *argv, "--epochs", "1"]) == 1
    assert one_line_error(capsys).startswith(f"yolotrain train: error: {message}")
    assert not any(tmp_path.iterdir())  # nothing was started


@pytest.mark.parametrize(("argv", "error"), [
    (["train", "--epoch", "3"], "yolotrain train: error: unrecognized arguments: --epoch 3; did you mean --epochs?"),
    (["train", "--epochz", "3"], "yolotrain train: error: unrecognized arguments: --epochz 3; did you mean --epochs?"),
    (["train", "--img-siz", "64"], "yolotrain train: error: unrecognized arguments: --img-siz 64; did you mean "
                                   "--img-size?"),
    (["val", "--weight", "a.pt", "--data", "d.yaml"],  # the misspelt option, not the required one it misses
     "yolotrain val: error: unrecognized arguments: --weight; did you mean --weights?"),
    (["data", "shapes", "--n-tr", "3"], "yolotrain data shapes: error: unrecognized arguments: --n-tr 3; did you "
                                        "mean --n-train?"),
])
def test_options_are_spelt_in_full_and_a_misspelt_one_gets_the_closest(argv, error, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert one_line_error(capsys) == error


@pytest.mark.parametrize(("argv", "error"), [
    (["predict", "--weights", "a.pt", "--model", "b.pt", "--source", "images"],
     "yolotrain predict: error: --weights and --model are two spellings of one option: give it once"),
    (["val", "--weights", "a.pt", "--data", "d.yaml", "--img", "320", "--imgsz", "640"],
     "yolotrain val: error: --img and --imgsz are two spellings of one option: give it once"),
    (["export", "model=a.pt", "--weights=b.pt"],
     "yolotrain export: error: --model and --weights are two spellings of one option: give it once"),
    (["track", "--weights", "a.pt", "--source", "v.mp4", "--conf", "0.2", "--conf-thres=0.3"],
     "yolotrain track: error: --conf and --conf-thres are two spellings of one option: give it once"),
])
def test_one_option_under_two_spellings_stops_in_one_line(argv, error, capsys, tmp_path, monkeypatch):
    """Which spelling would win is the order of the line, not what its writer meant: the line is refused."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert one_line_error(capsys) == error
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv", [
    ["predict", "--weights", "a.pt", "--weights", "b.pt", "--source", "images"],  # one spelling twice: the last
    ["predict", "--weights", "a.pt", "--source", "images", "--half", "--no-half"],  # a switch and its --no- form
    ["predict", "--weights", "a.pt", "--source", "images", "--name=--model"],  # a value, not an option
])
def test_one_spelling_twice_a_switch_and_its_negation_and_values_are_taken(argv):
    build_parser().parse_args(argv)


def test_version_is_printed():
    run = subprocess.run([sys.executable, "-m", "yolotrain", "--version"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == f"yolotrain {yolotrain.__version__}"


def parsed(argv: list[str]) -> dict[str, object]:
    return vars(build_parser().parse_args(argv))


@pytest.mark.parametrize(("key_values", "options"), [
    (["train", "data=coco.yaml", "epochs=3", "imgsz=640"], ["train", "--data", "coco.yaml", "--epochs", "3",
                                                             "--imgsz", "640"]),
    (["train", "img_size=320", "batch-size=8", "save_period=-1", "freeze=0,1,2", "rect=true", "cos_lr=false",
      "noval=true", "cache=true", "name=a=b"],
     ["train", "--img-size", "320", "--batch-size", "8", "--save-period", "-1", "--freeze", "0", "1", "2", "--rect",
      "--no-cos-lr", "--noval", "--cache", "--name", "a=b"]),
    (["train", "--name", "epochs=3"], ["train", "--name", "epochs=3"]),  # an option's value stays a value
    (["tune", "trials=4", "epochs=2", "weights=yolov5n.pt"], ["tune", "--trials", "4", "--epochs", "2", "--weights",
                                                              "yolov5n.pt"]),
    (["val", "weights=a.pt", "data=d.yaml", "conf_thres=0.1", "half=true"],
     ["val", "--weights", "a.pt", "--data", "d.yaml", "--conf-thres", "0.1", "--half"]),
    (["predict", "weights=a.pt", "source=images", "imgsz=320", "save_txt=true"],
     ["predict", "--weights", "a.pt", "--source", "images", "--imgsz", "320", "--save-txt"]),
    (["export", "weights=a.pt", "include=onnx,openvino", "dynamic=true"],
     ["export", "--weights", "a.pt", "--include", "onnx", "openvino", "--dynamic"]),
    (["track", "weights=a.pt", "source=v.mp4", "tracker=botsort.yaml", "trail=5"],
     ["track", "--weights", "a.pt", "--source", "v.mp4", "--tracker", "botsort.yaml", "--trail", "5"]),
    # Ultralytics' model= (and --model) names the weights of the commands that run them.
    (["predict", "model=yolov8n.pt", "source=images"], ["predict", "--weights", "yolov8n.pt", "--source", "images"]),
    (["predict", "--model", "a.pt", "b.pt", "--source", "images"],
     ["predict", "--weights", "a.pt", "b.pt", "--source", "images"]),
    (["val", "model=a.pt", "data=d.yaml"], ["val", "--weights", "a.pt", "--data", "d.yaml"]),
    (["track", "--model", "a.pt", "--source", "v.mp4"], ["track", "--weights", "a.pt", "--source", "v.mp4"]),
    (["export", "model=a.pt", "format=onnx"], ["export", "--weights", "a.pt", "--format", "onnx"]),
    # and its batch= and show=
    (["val", "model=a.pt", "data=d.yaml", "batch=16"], ["val", "--weights", "a.pt", "--data", "d.yaml",
                                                         "--batch-size", "16"]),
    (["predict", "model=a.pt", "source=v.mp4", "show=true"], ["predict", "--weights", "a.pt", "--source", "v.mp4",
                                                              "--view-img"]),
    (["track", "model=a.pt", "source=v.mp4", "show=false"], ["track", "--weights", "a.pt", "--source", "v.mp4",
                                                             "--no-view-img"]),
])
def test_key_value_arguments_are_the_options_of_those_settings(key_values, options):
    assert parsed(key_values) == parsed(options)


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "epoch=3"], "yolotrain train: error: epoch=3: unknown setting 'epoch'; did you mean 'epochs'?"),
    (["val", "weights=a.pt", "data=d.yaml", "conf_thre=0.1"],
     "yolotrain val: error: conf_thre=0.1: unknown setting 'conf_thre'; did you mean 'conf_thres'?"),
    (["train", "rect=maybe"], "yolotrain train: error: rect=maybe: expected true or false"),
])
def test_a_bad_key_value_argument_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert one_line_error(capsys) == message


def test_choices_are_taken_in_any_case(capsys):
    args = build_parser().parse_args(["train", "--optimizer", "adam", "--amp", "FP16", "--logger", "MLflow,WANDB"])
    config = resolve_config(**train_settings(args))
    assert (config.optim.optimizer, config.amp, config.loggers) == ("Adam", "fp16", ("mlflow", "wandb"))
    assert build_parser().parse_args(["train", "optimizer=adamw"]).optimizer == "AdamW"
    assert build_parser().parse_args(["train", "--cache", "RAM"]).cache == "ram"
    assert parsed(["val", "--weights", "a.pt", "--data", "d.yaml", "--task", "Speed"])["mode"] == "speed"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--optimizer", "sgdd"])
    assert "invalid choice: 'sgdd'" in one_line_error(capsys)
