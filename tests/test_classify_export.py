"""Classifier exports: ONNX, OpenVINO and TorchScript give the PyTorch model's logits ``[B, nc]``, their runtimes
report ``task == "classify"``, ``val`` on them scores as PyTorch does, and the rest is refused in one line."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

from yolotrain import val
from yolotrain.checkpoint import CheckpointError
from yolotrain.data.classify import write_shape_crops
from yolotrain.detector import BoxDetector, Detector
from yolotrain.interop import export, load_exported
from yolotrain.model.classify import Classifier

pytest.importorskip("onnxruntime", reason="needs the export extra: pip install 'yolotrain[export]'")

SIZE = 64
OPENVINO = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="pip install 'yolotrain[openvino]'")
SUFFIX = {"onnx": ".onnx", "openvino": ".xml", "torchscript": ".torchscript", "ncnn": ".ncnn.param", "mnn": ".mnn",
          "executorch": ".pte"}
NCNN = pytest.mark.skipif(importlib.util.find_spec("pnnx") is None or importlib.util.find_spec("ncnn") is None,
                          reason="pip install 'yolotrain[ncnn]'")
MNN = pytest.mark.skipif(importlib.util.find_spec("MNN") is None, reason="pip install 'yolotrain[mnn]'")
EXECUTORCH = pytest.mark.skipif(importlib.util.find_spec("executorch") is None,
                                reason="pip install 'yolotrain[executorch]'")
FORMATS = ["onnx", pytest.param("openvino", marks=OPENVINO), "torchscript", pytest.param("ncnn", marks=NCNN),
           pytest.param("mnn", marks=MNN), pytest.param("executorch", marks=EXECUTORCH)]


@pytest.fixture(scope="module")
def classifier() -> Classifier:
    """A classifier with non-trivial BatchNorm statistics, so its logits differ from image to image."""
    torch.manual_seed(0)
    model = Classifier.from_name("yolov5n-cls", 2, ["circle", "rectangle"])
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean = torch.randn_like(module.running_mean) * 0.1
            module.running_var = torch.rand_like(module.running_var) + 0.5
    return model.eval()


@pytest.fixture(scope="module")
def crops(tmp_path_factory) -> Path:
    return write_shape_crops(tmp_path_factory.mktemp("crops") / "shapes-cls", n_train=1, n_val=6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_exports_give_the_logits_and_accuracy_of_torch(classifier, crops, tmp_path, fmt):
    out = tmp_path / f"cls{SUFFIX[fmt]}"
    export(classifier, fmt, out=out, img_size=SIZE, dynamic_size=fmt != "torchscript")
    runner = load_exported(out, trust_code=True)
    assert (runner.task, runner.num_classes, runner.names, runner.default_img_size) == \
        ("classify", 2, ["circle", "rectangle"], SIZE)
    sizes = [(SIZE, SIZE), (96, 128)] if runner.dynamic_size else [(SIZE, SIZE)]
    for h, w in sizes:
        imgs = torch.randn(3, 3, h, w, generator=torch.Generator().manual_seed(h))
        with torch.inference_mode():
            expected = copy.deepcopy(classifier).fuse()(imgs)
        logits = runner(imgs)
        assert logits.shape == expected.shape == (3, 2)
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    ours = val(classifier, str(crops), img_size=SIZE, verbose=False, plots=False, half=False)  # as the export
    theirs = val(str(out), str(crops), img_size=SIZE, verbose=False, plots=False, trust_code=True)
    assert (theirs.top1, theirs.top5) == (ours.top1, ours.top5)
    assert theirs.confusion.tolist() == ours.confusion.tolist()


@pytest.mark.parametrize(("fmt", "options", "message"), [
    ("tflite", {}, "classifiers export to executorch, mnn, ncnn, onnx, openvino, paddle, pb, saved_model, "
                   "tfjs, torchscript, not tflite"),
    ("onnx", {"half": True}, "--half is for detection models: a classifier's export gives float32 logits"),
    ("onnx", {"raw": True}, "--raw is for detection models"),
    ("torchscript", {"raw": True, "nms": False}, "--raw is for detection models"),
    ("onnx", {"nms": True}, "--nms is for detection models"),
])
def test_what_a_classifier_cannot_be_exported_as_is_one_line(classifier, tmp_path, fmt, options, message):
    with pytest.raises(ValueError, match=message) as error:
        export(classifier, fmt, out=tmp_path / "x.out", img_size=SIZE, **options)
    assert "\n" not in str(error.value) and not list(tmp_path.iterdir())


def test_classifier_metadata_that_contradicts_the_logits_is_one_line(classifier, tmp_path):
    import onnx

    path = tmp_path / "cls.onnx"
    export(classifier, "onnx", out=path, img_size=SIZE, simplify=False)
    proto = onnx.load(str(path))
    for entry in proto.metadata_props:
        if entry.key == "nc":
            entry.value = "3"
        elif entry.key == "class_names":
            entry.value = '["a", "b", "c"]'
    onnx.save(proto, str(path))
    with pytest.raises(CheckpointError, match="nc 3 of a classifier") as error:
        load_exported(path)
    assert "\n" not in str(error.value)


def test_a_classifier_export_has_no_strides_only_the_multiple_its_inputs_round_to(classifier, tmp_path):
    import onnx

    path = tmp_path / "cls.onnx"
    export(classifier, "onnx", out=path, img_size=SIZE, simplify=False)
    proto = onnx.load(str(path))
    metadata = {entry.key: entry.value for entry in proto.metadata_props}
    assert metadata["stride"] == "32" and "strides" not in metadata and "anchors" not in metadata
    runner = load_exported(path)
    assert runner.size_multiple == 32 and isinstance(runner, Detector) and not isinstance(runner, BoxDetector)
    assert not any(hasattr(runner, name) for name in ("stride", "max_stride", "end_to_end"))
    # Exports made before held our JSON lists under `names` and `stride` (a classifier's one stride).
    del proto.metadata_props[:]
    metadata.update(names='["circle", "rectangle"]', stride="[32]")
    del metadata["class_names"]
    for key, value in metadata.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(path))
    older = load_exported(path)
    assert (older.names, older.size_multiple) == (["circle", "rectangle"], 32)
