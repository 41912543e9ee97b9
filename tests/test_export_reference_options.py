"""The reference's export.py command line runs as ``yolotrain export``: every option its ``parse_opt`` defines
is accepted with the same meaning, accepted as having no effect here (saying why), or stops the run in one
line saying why; the ones that differ are listed in docs/coming-from-yolov5.md."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from test_reference_options import reference_options

from yolotrain import Yolov5
from yolotrain.checkpoint import save_checkpoint
from yolotrain.cli import build_parser, main
from yolotrain.interop import load_exported
from yolotrain.interop.exporting.exporter import (
    NO_EFFECT_REFERENCE_OPTIONS,
    UNSUPPORTED_EXPORT_OPTIONS,
    ExportConfig,
    export_config,
)

YOLOV5_PAGE = Path(__file__).resolve().parents[1] / "docs" / "coming-from-yolov5.md"

# A value for each reference option that takes one, unlike yolotrain's default so the effect shows.
VALUES = {"--data": "data.yaml", "--weights": "w.pt", "--imgsz": "320", "--img": "320", "--img-size": "320",
          "--device": "0", "--opset": "18", "--iou-thres": "0.6", "--conf-thres": "0.3", "--topk-all": "100",
          "--include": "openvino", "--batch-size": "4", "--workspace": "8", "--topk-per-class": "50"}
# Reference option → the ExportConfig setting it sets and the value it gets, given VALUES.
SAME_MEANING = {
    "--data": ("data", "data.yaml"), "--weights": ("weights", "w.pt"), "--imgsz": ("img_size", (320,)),
    "--img": ("img_size", (320,)), "--img-size": ("img_size", (320,)), "--half": ("half", True),
    "--int8": ("int8", True), "--dynamic": ("dynamic_size", True), "--simplify": ("simplify", True),
    "--opset": ("opset", 18), "--nms": ("nms", True), "--topk-all": ("max_det", 100), "--iou-thres": ("iou", 0.6),
    "--conf-thres": ("conf", 0.3), "--include": ("format", ("openvino",)), "--optimize": ("optimize", True),
    "--keras": ("keras", True),
}


def reference_export_options() -> dict[str, list[str]]:
    return dict(reference_options("export.py", VALUES))


def test_every_reference_export_option_is_classified_and_documented():
    flags = set(reference_export_options())
    assert len(flags) > 20
    assert flags == set(SAME_MEANING) | set(UNSUPPORTED_EXPORT_OPTIONS) | set(NO_EFFECT_REFERENCE_OPTIONS)
    differences = YOLOV5_PAGE.read_text().split("## Differences from the reference export.py")[1].split("\n## ")[0]
    for flag in (*UNSUPPORTED_EXPORT_OPTIONS, *NO_EFFECT_REFERENCE_OPTIONS):
        assert f"`{flag}`" in differences, flag


@pytest.mark.parametrize("flag", sorted(SAME_MEANING))
def test_reference_export_option_has_the_same_meaning(flag):
    value = reference_export_options()[flag]
    args = build_parser().parse_args(["export", "--weights", "w.pt", flag, *value])
    setting, expected = SAME_MEANING[flag]
    assert setting in vars(args)  # given explicitly, not a default that happens to agree
    assert getattr(export_config(args), setting) == expected


@pytest.mark.parametrize("flag", sorted(NO_EFFECT_REFERENCE_OPTIONS))
def test_reference_export_option_without_effect_is_accepted(flag):
    args = build_parser().parse_args(["export", "--weights", "w.pt", flag, *reference_export_options()[flag]])
    assert export_config(args) == ExportConfig(weights="w.pt")


@pytest.mark.parametrize("flag", sorted(UNSUPPORTED_EXPORT_OPTIONS))
def test_unsupported_reference_export_option_stops_in_one_line(flag, tmp_path, capsys):
    weights = tmp_path / "w.pt"
    assert main(["export", "--weights", str(weights), flag, *reference_export_options()[flag]]) == 1
    err = capsys.readouterr().err
    assert err == f"yolotrain export: error: {flag} is not supported: {UNSUPPORTED_EXPORT_OPTIONS[flag]}\n"
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_reference_export_command_line_runs(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "best", Yolov5("n", num_classes=2).eval())
    weights = tmp_path / "best.json"
    assert main(["export", "--weights", str(weights), "--include", "onnx", "--imgsz", "320"]) == 0
    written = tmp_path / "best.onnx"
    assert capsys.readouterr().out.split() == [str(written)]
    runner = load_exported(written)
    assert runner.img_size == (320, 320) and runner.num_classes == 2
    assert runner(torch.rand(2, 3, 320, 320)).shape == (2, 3 * (40 * 40 + 20 * 20 + 10 * 10), 7)


def test_every_export_setting_has_a_command_line_option():
    parser = build_parser()
    export_parser = parser._subparsers._group_actions[0].choices["export"]
    dests = {action.dest for action in export_parser._actions}
    assert {f.name for f in dataclasses.fields(ExportConfig)} <= dests
