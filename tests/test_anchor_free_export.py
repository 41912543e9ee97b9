"""Exports of anchor-free models (YOLOv8, YOLO11, YOLOv5u): ONNX, OpenVINO and TorchScript give the PyTorch model's
decoded predictions (and prototype masks), their metadata names the family, ``val`` and ``predict`` on them score
as PyTorch does, NMS inside an export keeps PyTorch's detections, and ``--raw`` (anchor maps) is refused in one line.
Pose and oriented-box models give PyTorch's keypoints and angles in each format they export to, and every other
format is refused in one line."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util

import pytest
import torch
from conftest import untrained

from yolotrain import predict, val
from yolotrain.checkpoint import CheckpointError
from yolotrain.data import generate_shapes_dataset
from yolotrain.interop import export, load_exported
from yolotrain.interop.formats import REGISTRY, tfjs
from yolotrain.interop.formats.engine import tensorrt_unavailable
from yolotrain.model.anchor_free import AnchorFreeYolo
from yolotrain.task import get_task

pytest.importorskip("onnxruntime", reason="needs the export extra: pip install 'yolotrain[export]'")

SIZE = 96
OPENVINO = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="pip install 'yolotrain[openvino]'")
SUFFIX = {"onnx": ".onnx", "openvino": ".xml", "torchscript": ".torchscript", "ncnn": ".ncnn.param", "mnn": ".mnn",
          "tflite": ".tflite", "executorch": ".pte", "saved_model": "_saved_model", "pb": ".pb",
          "paddle": "_paddle_model", "tfjs": "_web_model", "engine": ".engine"}
NCNN = pytest.mark.skipif(importlib.util.find_spec("pnnx") is None or importlib.util.find_spec("ncnn") is None,
                          reason="pip install 'yolotrain[ncnn]'")
TENSORRT = pytest.mark.skipif(tensorrt_unavailable() is not None, reason="needs a CUDA GPU and tensorrt")
MNN = pytest.mark.skipif(importlib.util.find_spec("MNN") is None, reason="pip install 'yolotrain[mnn]'")
EXECUTORCH = pytest.mark.skipif(importlib.util.find_spec("executorch") is None,
                                reason="pip install 'yolotrain[executorch]'")
FORMATS = ["onnx", pytest.param("openvino", marks=OPENVINO), "torchscript", pytest.param("ncnn", marks=NCNN),
           pytest.param("mnn", marks=MNN), pytest.param("executorch", marks=EXECUTORCH)]
# `make test` runs these in the LiteRT environment (.venv-litert) and deselects them elsewhere.
TFLITE = (pytest.mark.litert, pytest.mark.skipif(
    importlib.util.find_spec("litert_torch") is None or importlib.util.find_spec("ai_edge_litert") is None,
    reason="pip install 'yolotrain[tflite]'"))


@pytest.fixture(scope="module")
def detector() -> AnchorFreeYolo:
    return untrained("yolov8n")


@pytest.fixture(scope="module")
def segmenter() -> AnchorFreeYolo:
    return untrained("yolo11n-seg")


@pytest.fixture(scope="module")
def pose_model() -> AnchorFreeYolo:
    return untrained("yolov8n-pose", kpt_shape=(4, 3))


@pytest.fixture(scope="module")
def obb_model() -> AnchorFreeYolo:
    return untrained("yolov8n-obb")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=2, n_val=6, img_size=SIZE)


def exported(model: AnchorFreeYolo, folder, fmt: str, **options):
    out = folder / f"{model.arch_name}{SUFFIX[fmt]}"
    export(model, fmt, out=out, img_size=SIZE, dynamic_size=fmt != "torchscript", **options)
    return load_exported(out, trust_code=True)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("arch", ["detector", "segmenter"])
def test_exports_give_the_decoded_predictions_of_pytorch(request, tmp_path, fmt, arch):
    model = request.getfixturevalue(arch)
    runtime = exported(model, tmp_path, fmt)
    assert (runtime.family, runtime.anchors_per_level, runtime.names) == ("anchor_free", 1, model.names)
    assert runtime.task == model.task and runtime.stride.tolist() == model.stride.tolist()
    assert_decoded_like_pytorch(model, runtime, score_tol=1e-4, box_tol=1e-3, proto_tol=1e-4)


def assert_decoded_like_pytorch(model: AnchorFreeYolo, runtime, score_tol: float, box_tol: float,
                                proto_tol: float) -> None:
    """``runtime``'s outputs for random images are the fused PyTorch model's: scores (objectness 1) within
    ``score_tol``, boxes within ``box_tol`` px, a segmenter's prototype masks within ``proto_tol``."""
    imgs = torch.rand(2, 3, SIZE, SIZE)
    with torch.no_grad():
        expected = copy.deepcopy(model).fuse()(imgs)
    actual = runtime(imgs)
    expected, actual = (expected, actual) if model.task == "segment" else ((expected,), (actual,))
    for a, b in zip(actual, expected):
        assert a.shape == b.shape
    decoded, reference = actual[0], expected[0]
    torch.testing.assert_close(decoded[..., 4:], reference[..., 4:], atol=score_tol, rtol=0)
    torch.testing.assert_close(decoded[..., :4], reference[..., :4], atol=box_tol, rtol=1e-5)  # pixels
    assert torch.equal(decoded[..., 4], torch.ones_like(decoded[..., 4]))
    if model.task == "segment":
        torch.testing.assert_close(actual[1], expected[1], atol=proto_tol, rtol=proto_tol)


@TENSORRT
@pytest.mark.parametrize("arch", ["detector", "segmenter"])
def test_tensorrt_engines_give_the_decoded_predictions_of_pytorch(request, tmp_path, arch, shapes):
    """On a CUDA GPU with tensorrt (``benchmarks/gpu_check.sh``): the engine's decoded predictions are the PyTorch
    model's on the CPU within the tolerances of GPU float32 kernels (those of ``tests/test_deploy.py``), and
    ``predict`` on it finds the PyTorch model's classes and boxes."""
    model = request.getfixturevalue(arch)
    runtime = exported(model, tmp_path, "engine")
    assert (runtime.family, runtime.task, runtime.precision) == ("anchor_free", model.task, "fp32")
    assert_decoded_like_pytorch(model, runtime, score_tol=1e-3, box_tol=1e-2, proto_tol=1e-3)
    images = sorted((shapes / "images" / "val").iterdir())[:3]
    expected = predict(model, images, img_size=SIZE, conf=0.5, half=False, device="cpu")
    actual = predict(runtime.path, images, img_size=SIZE, conf=0.5, trust_code=True)
    for a, b in zip(expected, actual):
        assert len(a.boxes) == len(b.boxes) and torch.equal(a.classes, b.classes)
        torch.testing.assert_close(b.boxes, a.boxes, atol=0.05, rtol=1e-3)


@pytest.mark.parametrize(("fmt", "precision", "score_tol", "box_tol"), [
    ("onnx", "fp16", 5e-3, 0.5), ("onnx", "int8", 0.05, 4.0),  # tolerances of tests/test_deploy.py (96 px input)
    # LiteRT's int8 graph also quantizes the distance distributions: a box side is the expectation over 16 rounded
    # bins (measured: at most 5.1 px of 96, on 4 of 1,512 values).
    pytest.param("tflite", "fp32", 1e-4, 1e-3, marks=TFLITE), pytest.param("tflite", "int8", 0.05, 6.0, marks=TFLITE),
])
def test_reduced_precision_and_litert_exports_stay_within_their_tolerance(detector, shapes, tmp_path, fmt, precision,
                                                                           score_tol, box_tol):
    out = tmp_path / f"{precision}{SUFFIX[fmt]}"
    export(detector, fmt, out=out, img_size=SIZE, dynamic_size=fmt == "onnx", half=precision == "fp16",
           int8=precision == "int8", data=str(shapes / "data.yaml"))
    runtime = load_exported(out)
    assert (runtime.family, runtime.precision) == ("anchor_free", precision)
    imgs = torch.rand(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = copy.deepcopy(detector).fuse()(imgs)
    actual = runtime(imgs)
    torch.testing.assert_close(actual[..., 4:], expected[..., 4:], atol=score_tol, rtol=0)
    torch.testing.assert_close(actual[..., :4], expected[..., :4], atol=box_tol, rtol=0)


def test_val_and_predict_on_an_onnx_export_score_as_pytorch(detector, shapes, tmp_path):
    path = exported(detector, tmp_path, "onnx").path
    data = str(shapes / "data.yaml")
    ours = val(detector, data, img_size=SIZE, batch_size=3, workers=0, verbose=False, plots=False, half=False)
    theirs = val(str(path), data, img_size=SIZE, batch_size=3, workers=0, verbose=False, plots=False)
    for a, b in ((ours.mp, theirs.mp), (ours.mr, theirs.mr), (ours.map50, theirs.map50), (ours.map, theirs.map)):
        assert a == pytest.approx(b, abs=1e-3)
    images = sorted((shapes / "images" / "val").iterdir())[:3]
    expected = predict(detector, images, img_size=SIZE, conf=0.5, half=False)
    actual = predict(path, images, img_size=SIZE, conf=0.5)
    assert sum(len(r.boxes) for r in expected) > 0
    for a, b in zip(expected, actual):
        assert len(a.boxes) == len(b.boxes) and torch.equal(a.classes, b.classes)
        torch.testing.assert_close(b.boxes, a.boxes, atol=0.05, rtol=1e-4)


def test_nms_inside_an_export_keeps_the_detections_of_pytorch(detector, tmp_path):
    from yolotrain.nms import non_max_suppression

    (tmp_path / "default").mkdir()
    assert exported(detector, tmp_path / "default", "onnx", nms=True).nms_settings["iou"] == 0.7  # the family's
    # YOLOv5's threshold: at 0.7 this untrained model keeps neighbouring boxes of equal scores, whose order (and so
    # which of them survives) is a tie either NMS may break its own way.
    runtime = exported(detector, tmp_path, "onnx", nms=True, iou=0.45)
    assert runtime.end_to_end
    imgs = torch.rand(1, 3, SIZE, SIZE)
    settings = runtime.nms_settings
    with torch.no_grad():
        expected = non_max_suppression(copy.deepcopy(detector).fuse()(imgs), settings["conf"], settings["iou"],
                                       multi_label=settings["multi_label"], max_det=settings["max_det"])[0]
    actual = runtime.detections(imgs, settings["conf"], settings["iou"], settings["max_det"],
                                multi_label=settings["multi_label"])[0]
    assert len(expected) > 0 and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=1e-3, rtol=1e-5)


def test_raw_maps_are_refused_for_an_anchor_free_model(detector, tmp_path):
    with pytest.raises(ValueError, match=r"^--raw exports YOLOv5's anchor-based head maps; an anchor-free model"):
        export(detector, "onnx", out=tmp_path / "raw.onnx", img_size=SIZE, raw=True)
    assert not (tmp_path / "raw.onnx").exists()


@pytest.mark.skipif(importlib.util.find_spec("coremltools") is None, reason="pip install 'yolotrain[coreml]'")
@pytest.mark.parametrize("half", [False, True])
def test_coreml_export_of_an_anchor_free_detector_has_its_decoded_output_and_family(detector, tmp_path, half):
    """Core ML programs cannot run on Linux: the program holds the DFL decode (a softmax over each side's bins)
    and gives one prediction per grid cell in YOLOv5's decoded form, and its metadata names the family."""
    import coremltools as ct

    path = export(detector, "coreml", out=tmp_path / "yolov8n.mlpackage", img_size=SIZE, half=half)
    spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    (inp,), (out,) = spec.description.input, spec.description.output
    cells = sum((SIZE // stride) ** 2 for stride in (8, 16, 32))  # one prediction per cell: no anchors
    assert (inp.name, list(inp.type.multiArrayType.shape)) == ("images", [1, 3, SIZE, SIZE])
    assert (out.name, list(out.type.multiArrayType.shape)) == ("output0", [1, cells, 5 + len(detector.names)])
    meta = dict(spec.description.metadata.userDefined)
    assert (meta["family"], meta["model"], meta["reg_max"]) == ("anchor_free", "yolov8n", "16")
    assert meta["precision"] == ("fp16" if half else "fp32") and "anchors" not in meta
    ops = {op.type for block in spec.mlProgram.functions["main"].block_specializations.values()
           for op in block.operations}
    assert {"conv", "softmax", "sigmoid"} <= ops
    with pytest.raises(CheckpointError, match="Core ML prediction needs macOS"):
        load_exported(path)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("family", "anchorless", "yolotrain metadata field 'family' must be one of yolov5, anchor_free"),
    ("raw", "true", "yolotrain metadata of an anchor_free model with raw outputs, which its exports never have"),
    ("family", "yolov5", "yolotrain metadata field 'anchors' must be"),  # YOLOv5's exports carry anchors
])
def test_edited_family_metadata_is_one_line_at_load(detector, tmp_path, key, value, message):
    import onnx

    path = exported(detector, tmp_path, "onnx").path
    proto = onnx.load(str(path))
    next(p for p in proto.metadata_props if p.key == key).value = value
    onnx.save(proto, str(path))
    with pytest.raises(CheckpointError, match=message) as error:
        load_exported(path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("arch", ["detector", "segmenter"])
def test_sliced_inference_with_one_tile_equals_the_whole_image(request, shapes, arch):
    """Anchor-free models are tiled like YOLOv5's (their decoded outputs have its form): one tile covering the
    letterboxed image gives the unsliced boxes, and masks for a segmentation model."""
    model = request.getfixturevalue(arch)
    images = sorted((shapes / "images" / "val").iterdir())[:2]
    whole = predict(model, images, img_size=SIZE, conf=0.5, half=False)
    tiled = predict(model, images, img_size=SIZE, conf=0.5, half=False, slice=SIZE)
    assert sum(len(r.boxes) for r in whole) > 0
    for a, b in zip(whole, tiled):
        assert len(a.boxes) == len(b.boxes) and torch.equal(a.classes, b.classes)
        torch.testing.assert_close(b.boxes, a.boxes, atol=1e-3, rtol=1e-5)
        assert (a.masks is None) == (b.masks is None) == (model.task == "detect")


# The formats a pose or oriented-box model exports to, each compared with PyTorch below, and those it is refused:
# together every format the exporter knows.
# Each TensorFlow conversion takes about a minute here: run on demand (tests/test_tensorflow_export.py checks the
# formats on detectors in every run).
TENSORFLOW_SLOW = (pytest.mark.slow, pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("tensorflow", "tf_keras", "onnx2tf")),
    reason="pip install 'yolotrain[tensorflow]'"))
# TF.js converts the SavedModel in an environment of its own and runs under Node (see tests/test_tfjs_export.py).
TFJS_SLOW = (*TENSORFLOW_SLOW, pytest.mark.skipif(tfjs.unavailable() is not None or tfjs.node_unavailable() is not None,
                                                  reason="make .venv-tfjs/.installed .node-tfjs/.installed"))
KEYPOINT_AND_ANGLE_FORMATS = [*FORMATS, pytest.param("tflite", marks=TFLITE),
                              pytest.param("saved_model", marks=TENSORFLOW_SLOW),
                              pytest.param("pb", marks=TENSORFLOW_SLOW), pytest.param("tfjs", marks=TFJS_SLOW)]
REFUSED_FOR_KEYPOINTS_AND_ANGLES = ["coreml", "engine"]
# Tested in a pytest process of their own (marker paddle): Paddle crashes in a process that loaded TensorFlow.
OWN_PROCESS_FORMATS = ["paddle"]
PADDLE = pytest.mark.skipif(any(importlib.util.find_spec(name) is None for name in ("paddle", "x2paddle")),
                            reason="pip install 'yolotrain[paddle]'")


def test_every_format_either_exports_keypoints_and_angles_or_is_refused():
    tested = {p if isinstance(p, str) else p.values[0] for p in KEYPOINT_AND_ANGLE_FORMATS} | set(OWN_PROCESS_FORMATS)
    assert tested.isdisjoint(REFUSED_FOR_KEYPOINTS_AND_ANGLES)
    assert tested | set(REFUSED_FOR_KEYPOINTS_AND_ANGLES) == set(REGISTRY)
    assert get_task("pose").export_formats == get_task("obb").export_formats == tested


@pytest.mark.parametrize("fmt", KEYPOINT_AND_ANGLE_FORMATS)
@pytest.mark.parametrize("arch", ["pose_model", "obb_model"])
def test_pose_and_oriented_box_exports_give_the_keypoints_and_angles_of_pytorch(request, tmp_path, fmt, arch):
    model = request.getfixturevalue(arch)
    runtime = exported(model, tmp_path, fmt)
    assert (runtime.family, runtime.task, runtime.names) == ("anchor_free", model.task, model.names)
    imgs = torch.rand(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = copy.deepcopy(model).fuse()(imgs)
    actual = runtime(imgs)
    extra = 4 * 3 if model.task == "pose" else 1  # the keypoints (x, y, visibility), or the angle
    assert actual.shape == expected.shape == (2, expected.shape[1], 5 + 2 + extra)
    torch.testing.assert_close(actual[..., 4:7], expected[..., 4:7], atol=1e-4, rtol=0)  # objectness 1, scores
    torch.testing.assert_close(actual[..., :4], expected[..., :4], atol=1e-3, rtol=1e-5)  # pixels
    if model.task == "pose":
        torch.testing.assert_close(actual[..., 7:].unflatten(-1, (4, 3)), expected[..., 7:].unflatten(-1, (4, 3)),
                                   atol=1e-3, rtol=1e-5)  # x, y in pixels, visibility 0..1
    else:
        torch.testing.assert_close(actual[..., 7], expected[..., 7], atol=1e-4, rtol=0)  # radians


@pytest.mark.paddle  # in a pytest process of its own under `make test` (see tests/test_paddle_export.py)
@PADDLE
@pytest.mark.parametrize("arch", ["pose_model", "obb_model"])
def test_pose_and_oriented_box_exports_to_paddle_give_the_keypoints_and_angles_of_pytorch(request, tmp_path, arch):
    test_pose_and_oriented_box_exports_give_the_keypoints_and_angles_of_pytorch(request, tmp_path, "paddle", arch)


@pytest.mark.parametrize(("fmt", "arch", "what", "task"), [
    *((fmt, arch, what, task) for fmt in REFUSED_FOR_KEYPOINTS_AND_ANGLES
      for arch, what, task in (("pose_model", "pose", "pose"), ("obb_model", "oriented-box", "obb")))])
def test_pose_and_oriented_box_exports_to_other_formats_are_one_line(request, tmp_path, monkeypatch, fmt, arch,
                                                                      what, task):
    """Refused before anything is written, also where the format's own tools are installed."""
    monkeypatch.setitem(REGISTRY, fmt, dataclasses.replace(REGISTRY[fmt], unavailable=None))
    supported = ", ".join(sorted(get_task(task).export_formats))
    out = tmp_path / f"model{REGISTRY[fmt].suffix}"
    with pytest.raises(ValueError, match=rf"^{what} models export to {supported}, not {fmt}$"):
        export(request.getfixturevalue(arch), fmt, out=out, img_size=SIZE)
    assert list(tmp_path.iterdir()) == []
