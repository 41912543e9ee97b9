"""One model interface: the Detector protocol (PyTorch model and exported runtimes), its box sub-protocol and
resolve_model."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import YOLOV5N_WEIGHTS

import yolotrain
from yolotrain import Detector, Yolov5, resolve_model
from yolotrain.checkpoint import CheckpointError, save_checkpoint
from yolotrain.detector import BoxDetector, EndToEndDetector
from yolotrain.interop import ExportedModel, export, resolve_trainable
from yolotrain.interop.trust import UntrustedModelError

SIZE = 64
NAMES = ["cat", "dog"]
OPENVINO = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="pip install 'yolotrain[openvino]'")
# A small model YAML in the reference's format (a Conv stem, then the Detect head over one level).
TINY_YAML = """\
nc: 3
depth_multiple: 0.33
width_multiple: 0.25
anchors:
  - [10,13, 16,30, 33,23]
backbone:
  [[-1, 1, Conv, [64, 6, 2, 2]],
   [-1, 1, Conv, [128, 3, 2]],
   [-1, 1, Conv, [256, 3, 2]],
  ]
head:
  [[[2], 1, Detect, [nc, anchors]],
  ]
"""


@pytest.fixture(scope="module")
def tiny() -> Yolov5:
    torch.manual_seed(0)
    return Yolov5("n", num_classes=len(NAMES), names=NAMES).eval()


@pytest.fixture(scope="module")
def tiny_onnx(tiny, tmp_path_factory):
    return export(tiny, "onnx", out=tmp_path_factory.mktemp("export") / "tiny.onnx", img_size=SIZE)


def check_protocol(model: Detector, *, dynamic: bool, end_to_end: bool = False) -> None:
    """Every attribute of the protocols, with the values the tiny model implies."""
    assert isinstance(model, Detector) and isinstance(model, BoxDetector)
    assert (model.names, model.num_classes, model.task) == (NAMES, 2, "detect")
    assert model.stride.tolist() == [8.0, 16.0, 32.0] and model.max_stride == model.size_multiple == 32
    assert model.dynamic_size is dynamic and model.end_to_end is end_to_end
    assert model.fixed_size == (None if dynamic else (SIZE, SIZE))
    assert model.default_img_size == (640 if dynamic else SIZE)
    assert model.device == torch.device("cpu") and model.dtype == torch.float32 and model.precision == "fp32"
    imgs = torch.rand(2, 3, SIZE, SIZE, dtype=model.dtype, device=model.device)
    if end_to_end:
        assert isinstance(model, EndToEndDetector)
        assert [d.shape[1] for d in model.detections(imgs, 0.25, 0.45, 300)] == [6, 6]
    else:
        assert model(imgs).shape == (2, 3 * (8 * 8 + 4 * 4 + 2 * 2), 5 + 2)


def test_yolov5_is_a_detector(tiny):
    check_protocol(tiny, dynamic=True)
    half = Yolov5("n", num_classes=2).to(torch.bfloat16)
    assert (half.dtype, half.precision) == (torch.bfloat16, "bf16")


def test_onnx_runtime_is_a_detector(tiny_onnx):
    check_protocol(resolve_model(tiny_onnx), dynamic=False)


@pytest.mark.parametrize(("fmt", "suffix", "options"), [
    ("onnx", ".onnx", {"dynamic_size": True}),
    ("onnx", ".onnx", {"nms": True}),
    pytest.param("openvino", ".xml", {}, marks=OPENVINO),
    ("torchscript", ".torchscript", {}),
])
def test_exported_runtimes_are_detectors(tiny, tmp_path, fmt, suffix, options):
    path = export(tiny, fmt, out=tmp_path / f"tiny{suffix}", img_size=SIZE, **options)
    model = resolve_model(path, trust_code=True)
    assert isinstance(model, ExportedModel)
    check_protocol(model, dynamic=options.get("dynamic_size", False), end_to_end=options.get("nms", False))


def test_resolve_model_resolves_every_kind_of_spec(tiny, tiny_onnx, tmp_path):
    assert resolve_model(tiny) is tiny  # a model in memory is itself
    built = resolve_model("yolov5n", names=NAMES)
    assert (type(built), built.version, built.names) == (Yolov5, "n", NAMES)
    assert resolve_model("n6").size_multiple == 64 and resolve_model("yolov5n").num_classes == 80
    yaml_path = tmp_path / "tiny.yaml"
    yaml_path.write_text(TINY_YAML)
    from_yaml = resolve_model(yaml_path)
    assert (from_yaml.version, from_yaml.num_classes) == ("custom", 3)
    assert resolve_model(str(yaml_path), names=NAMES).names == NAMES
    json_path = save_checkpoint(tmp_path / "last", tiny)
    for spec in (json_path, tmp_path / "last.safetensors", str(tmp_path / "last")):
        loaded = resolve_model(spec)
        assert isinstance(loaded, Yolov5) and loaded.names == NAMES
        assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), tiny.state_dict().values()))
    torch.save(tiny.state_dict(), tmp_path / "plain.pt")
    assert resolve_model(tmp_path / "plain.pt").num_classes == 2
    assert isinstance(resolve_model(tiny_onnx), ExportedModel)


def test_resolve_model_moves_a_torch_model_to_the_device(tiny):
    assert resolve_model("yolov5n", device="cpu").device == torch.device("cpu")


@pytest.mark.skipif(not YOLOV5N_WEIGHTS.is_file(), reason="needs ../shared/weights/yolov5n.pt")
def test_resolve_model_reads_the_official_checkpoint():
    model = resolve_model(YOLOV5N_WEIGHTS)
    assert isinstance(model, Yolov5) and model.num_classes == 80 and model.names[0] == "person"
    assert isinstance(yolotrain.load(YOLOV5N_WEIGHTS), Yolov5)


def test_trainable_models_are_torch_models(tiny_onnx):
    assert resolve_trainable("yolov5n", names=NAMES).names == NAMES
    with pytest.raises(CheckpointError, match="an exported model, not a torch checkpoint"):
        resolve_trainable(tiny_onnx)
    assert yolotrain.load is resolve_trainable


@pytest.mark.parametrize(("spec", "error", "message"), [
    ("yolov5q", ValueError, "unknown YOLOv5 version 'yolov5q'"),
    ("missing/last", CheckpointError, "no such file"),
    ("missing.pt", CheckpointError, "no such file"),
    ("model.trt", CheckpointError, "model.trt: not a readable PyTorch checkpoint"),
    ("missing.yaml", FileNotFoundError, "model YAML not found: missing.yaml"),
    (3, TypeError, "expected a Yolov5 model, an exported one or a weights path, got int"),
])
def test_a_bad_spec_is_one_line(tmp_path, monkeypatch, spec, error, message):
    monkeypatch.chdir(tmp_path)
    if spec == "model.trt":
        (tmp_path / spec).write_bytes(b"not an engine")
    with pytest.raises(error, match=message) as info:
        resolve_model(spec)
    assert "\n" not in str(info.value)


def test_programs_stay_refused_without_trust(tiny, tmp_path):
    path = export(tiny, "torchscript", out=tmp_path / "tiny.torchscript", img_size=SIZE)
    with pytest.raises(UntrustedModelError):
        resolve_model(path)
