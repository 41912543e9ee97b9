"""Exports are checked when loaded and when run: yolotrain metadata that disagrees with the graph (an
edited ``nc``, ``stride``, anchors ...) and errors raised inside a runtime are one line naming the file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolotrain import Yolov5
from yolotrain.checkpoint import CheckpointError
from yolotrain.cli import main
from yolotrain.interop import export, load_exported

onnx = pytest.importorskip("onnx", reason="needs the export extra: pip install 'yolotrain[export]'")
pytest.importorskip("onnxruntime", reason="needs the export extra: pip install 'yolotrain[export]'")


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("exports")
    model = Yolov5("n", num_classes=2, names=["a", "b"]).eval()
    cv2.imwrite(str(folder / "img.jpg"), np.full((64, 64, 3), 90, np.uint8))
    return {"fixed": export(model, "onnx", out=folder / "fixed.onnx", img_size=64),
            "dynamic": export(model, "onnx", out=folder / "dynamic.onnx", img_size=64, dynamic_size=True),
            "image": folder / "img.jpg"}


def edited(source: Path, out: Path, **fields: str | None) -> Path:
    """A copy of an ONNX export with some yolotrain metadata fields replaced (None: removed)."""
    proto = onnx.load(str(source))
    kept = [(p.key, p.value) for p in proto.metadata_props if p.key not in fields]
    del proto.metadata_props[:]
    for key, value in kept + [(k, v) for k, v in fields.items() if v is not None]:
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(out))
    return out


@pytest.mark.parametrize(("fields", "message"), [
    ({"nc": "3", "class_names": '["a", "b", "c"]'},
     "its yolotrain metadata disagrees with its graph: strides [8, 16, 32], 3 anchors per level and nc 3 mean an "
     "output of [?, 252, 8], it gives [?, 252, 7]"),
    ({"strides": "[8, 16, 64]", "stride": "64"},
     "disagrees with its graph: strides [8, 16, 64], 3 anchors per level and nc 2 mean an output of [?, 243, 7], "
     "it gives [?, 252, 7]"),
    ({"anchors": "[[[10, 13], [16, 30]], [[30, 61], [62, 45]], [[116, 90], [156, 198]]]"},
     "2 anchors per level and nc 2 mean an output of [?, 168, 7], it gives [?, 252, 7]"),
    ({"img_size": "[128, 128]"}, "disagrees with its graph: img_size [128, 128], the graph takes [?, 3, 64, 64]"),
    ({"nc": "many"}, "yolotrain metadata field 'nc' must be an integer from 1 to 10000 (got 'many')"),
    ({"nc": "1000000000"}, "field 'nc' must be an integer from 1 to 10000"),
    ({"class_names": None}, "yolotrain metadata field 'class_names' must be a list of 2 class names (missing)"),
    ({"stride": "16"}, "metadata field 'stride' must be a multiple of the largest of 'strides' [8, 16, 32] (got '16')"),
    ({"strides": "[" * 100_000}, "field 'strides' must be a list of 1 to 8 strides"),
    ({"anchors": "[[[1, 2]]]"}, "field 'anchors' must be 3 levels (one per stride)"),
    ({"nms": '{"max_det": -1}'}, "field 'nms' must be the NMS settings"),
])
def test_edited_onnx_metadata_is_one_line_at_load(exports, tmp_path, fields, message):
    path = edited(exports["fixed"], tmp_path / "edited.onnx", **fields)
    with pytest.raises(CheckpointError) as info:
        load_exported(path)
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value), str(info.value)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_exports_made_before_the_reference_readable_fields_still_load(exports, tmp_path):
    # Earlier exports held our JSON lists under `names` and `stride`, without `class_names` and `strides`.
    path = edited(exports["fixed"], tmp_path / "old.onnx", class_names=None, strides=None, names='["a", "b"]',
                  stride="[8, 16, 32]")
    model = load_exported(path)
    assert (model.names, model.stride.tolist()) == (["a", "b"], [8, 16, 32])


def test_inputs_round_to_the_exports_stride_a_multiple_of_its_largest_output_stride(exports, tmp_path):
    # A model with a layer coarser than its head takes multiples of that layer's stride.
    model = load_exported(edited(exports["dynamic"], tmp_path / "coarse.onnx", stride="64"))
    assert (model.size_multiple, model.max_stride, model.stride.tolist()) == (64, 32, [8, 16, 32])
    assert load_exported(exports["dynamic"]).size_multiple == 32


def test_metadata_that_only_the_run_can_contradict_is_one_line_in_predict(exports, tmp_path, capsys):
    # With a free image size the graph's box count is not known until it runs.
    path = edited(exports["dynamic"], tmp_path / "edited.onnx", strides="[8, 16, 64]", stride="64")
    assert main(["predict", "--weights", str(path), "--source", str(exports["image"]), "--img", "64",
                 "--project", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"yolotrain predict: error: {path}: its yolotrain metadata "
                                               "disagrees with what it computed: strides [8, 16, 64]"), err


def test_a_runtime_error_inside_onnxruntime_is_one_line_naming_the_file(exports, capfd):
    model = load_exported(exports["dynamic"])
    with pytest.raises(CheckpointError) as info:
        model(torch.rand(1, 3, 100, 100))  # not a multiple of the strides: the graph's Concat fails
    message = str(info.value)
    assert message.startswith(f"{exports['dynamic']}: ONNX runtime failed on a batch of shape [1, 3, 100, 100] (")
    assert "Concat" in message and "\n" not in message
    assert "onnxruntime" not in capfd.readouterr().err  # the runtime's own log line is not printed as well


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="pip install 'yolotrain[openvino]'")
def test_openvino_metadata_and_runtime_errors_are_one_line(tmp_path):
    model = Yolov5("n", num_classes=2, names=["a", "b"]).eval()
    xml = export(model, "openvino", out=tmp_path / "model.xml", img_size=64, dynamic_size=True)
    with pytest.raises(CheckpointError) as info:
        load_exported(xml)(torch.rand(1, 3, 100, 100))
    assert str(info.value).startswith(f"{xml}: OpenVINO runtime failed on a batch of shape [1, 3, 100, 100] (")
    text = xml.read_text()
    xml.write_text(text.replace(json.dumps([8, 16, 32]), json.dumps([8, 16, 64]), 1)
                   .replace('<stride value="32"', '<stride value="64"', 1))
    assert json.dumps([8, 16, 64]) in xml.read_text()
    with pytest.raises(CheckpointError, match="its yolotrain metadata disagrees with what it computed: strides "
                                              r"\[8, 16, 64\]"):
        load_exported(xml)(torch.rand(1, 3, 64, 64))
