"""The reference's train.py command line runs after renaming only the program: every option its
``parse_opt`` defines is accepted by ``yolotrain train`` with the same meaning, or stops the run in one
line saying why, and is then listed in docs/coming-from-yolov5.md's differences from the reference."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from yolotrain.cli import UNSUPPORTED_TRAIN_OPTIONS, build_parser, main, train_settings
from yolotrain.engine import resolve_config

YOLOV5_PAGE = Path(__file__).resolve().parents[1] / "docs" / "coming-from-yolov5.md"

# A value for each reference option that takes one, unlike yolotrain's default so the effect shows.
VALUES = {"--weights": "yolov5s.pt", "--cfg": "yolov5s.yaml", "--data": "data.yaml", "--hyp": "hyp.yaml",
          "--epochs": "7", "--batch-size": "8", "--imgsz": "320", "--img": "320", "--img-size": "320",
          "--device": "cpu", "--optimizer": "Adam", "--workers": "3", "--project": "elsewhere", "--name": "trial",
          "--label-smoothing": "0.1", "--patience": "5", "--freeze": "10", "--save-period": "2", "--seed": "3",
          "--local_rank": "0", "--entity": "team", "--bbox_interval": "3"}
# Reference option → the setting it sets here and the value it gets, given VALUES.
SAME_MEANING = {
    "--weights": ("model", "yolov5s.pt"), "--cfg": ("model", "yolov5s"), "--data": ("data.path", "data.yaml"),
    "--epochs": ("epochs", 7), "--batch-size": ("data.batch_size", 8), "--imgsz": ("data.img_size", 320),
    "--img": ("data.img_size", 320), "--img-size": ("data.img_size", 320), "--rect": ("data.rect", True),
    "--noval": ("eval.val", False), "--noautoanchor": ("autoanchor", False), "--noplots": ("eval.plots", False),
    "--cache": ("data.cache", "ram"), "--device": ("device", "cpu"), "--multi-scale": ("data.multi_scale", True),
    "--single-cls": ("data.single_cls", True), "--optimizer": ("optim.optimizer", "Adam"),
    "--sync-bn": ("sync_bn", True), "--workers": ("data.workers", 3), "--project": ("project", "elsewhere"),
    "--name": ("name", "trial"), "--exist-ok": ("exist_ok", True), "--cos-lr": ("optim.cos_lr", True),
    "--label-smoothing": ("loss.label_smoothing", 0.1), "--patience": ("patience", 5), "--freeze": ("freeze", (10,)),
    "--save-period": ("save_period", 2), "--seed": ("seed", 3), "--entity": ("entity", "team"),
    "--image-weights": ("data.image_weights", True), "--quad": ("data.quad", True),
    "--bbox_interval": ("bbox_interval", 3),
}
# Options used outside the settings, checked on their own below (--evolve: in test_evolve.py).
OTHERS = {"--hyp", "--resume", "--local_rank", "--evolve"}


def reference_options(script: str = "train.py", values: dict[str, str] = VALUES) -> list[tuple[str, list[str]]]:
    """Each option string of a reference script's ``parse_opt`` with a representative value from ``values``,
    read from its source."""
    spec = importlib.util.find_spec("yolov5")
    if spec is None or spec.origin is None:
        pytest.skip("reference implementation not installed (pip install '.[parity]')")
    tree = ast.parse((Path(spec.origin).parent / script).read_text())
    parse_opt = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "parse_opt")
    options = []
    for call in ast.walk(parse_opt):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "add_argument":
            keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
            takes_value = keywords.get("action") != "'store_true'" and keywords.get("nargs") != "'?'"
            for flag in (ast.literal_eval(arg) for arg in call.args):
                value = values.get(flag, "value") if takes_value else None
                options.append((flag, [value] if value is not None else []))
    return options


def test_every_reference_option_is_classified_and_documented():
    flags = {flag for flag, _ in reference_options()}
    assert len(flags) > 40
    assert flags == set(SAME_MEANING) | set(UNSUPPORTED_TRAIN_OPTIONS) | OTHERS
    differences = YOLOV5_PAGE.read_text().split("## Differences from the reference train.py")[1].split("\n## ")[0]
    for flag in UNSUPPORTED_TRAIN_OPTIONS:
        assert f"`{flag}`" in differences, flag


@pytest.mark.parametrize("flag", sorted(SAME_MEANING))
def test_reference_option_has_the_same_meaning(flag):
    value = dict(reference_options())[flag]
    args = build_parser().parse_args(["train", flag, *value])
    config = resolve_config(**train_settings(args))
    path, expected = SAME_MEANING[flag]
    for part in path.split("."):
        config = getattr(config, part)
    assert config == pytest.approx(expected) if isinstance(expected, float) else config == expected


def test_reference_hyp_resume_and_local_rank(tmp_path):
    (tmp_path / "hyp.yaml").write_text("lr0: 0.02\nmosaic: 0.5\n")
    args = build_parser().parse_args(["train", "--hyp", str(tmp_path / "hyp.yaml"), "--local_rank", "0"])
    config = resolve_config(hyp=args.hyp, **train_settings(args))
    assert (config.optim.lr0, config.augment.mosaic) == (0.02, 0.5)
    assert build_parser().parse_args(["train", "--resume"]).resume is True
    # --weights '' --cfg NAME: the reference's way of training an architecture from scratch.
    args = build_parser().parse_args(["train", "--weights", "", "--cfg", "models/yolov5m6.yaml"])
    assert resolve_config(**train_settings(args)).model == "yolov5m6"


@pytest.mark.parametrize("flag", sorted(UNSUPPORTED_TRAIN_OPTIONS))
def test_unsupported_reference_option_stops_in_one_line(flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    value = dict(reference_options())[flag]
    assert main(["train", flag, *value, "--epochs", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"yolotrain train: error: {flag} is not supported: {UNSUPPORTED_TRAIN_OPTIONS[flag]}"
    assert not any(tmp_path.iterdir())  # nothing was started


def test_cfg_with_weights_starts_the_architecture_from_those_weights():
    """The reference's ``--cfg yolov5s-seg.yaml --weights yolov5s.pt``: the published architecture, whose
    tensors of the same name and shape come from the weights."""
    args = build_parser().parse_args(["train", "--weights", "yolov5s.pt", "--cfg", "yolov5s-seg.yaml"])
    settings = train_settings(args)
    assert (settings["model"], settings["pretrained"]) == ("yolov5s-seg", "yolov5s.pt")
