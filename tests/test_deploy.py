"""Deployment exports (OpenVINO, LiteRT, Core ML; fp16 and int8; NMS inside): each one exported, run
through its runtime and checked against PyTorch, through `val` and `predict` too, and bad requests
refused in one line with nothing left behind."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import YOLOV5N_WEIGHTS, coco128_subset

from yolotrain import Yolov5, predict, val
from yolotrain.checkpoint import CheckpointError, save_checkpoint
from yolotrain.data import generate_shapes_dataset
from yolotrain.eval import non_max_suppression
from yolotrain.interop import add_export_arguments, export, load_exported, run_export
from yolotrain.interop.exporting.exporter import DYNAMIC_FORMATS
from yolotrain.interop.formats.engine import tensorrt_unavailable
from yolotrain.interop.formats.torchscript import read_metadata as read_torchscript_metadata

pytest.importorskip("onnxruntime", reason="needs the export extra: pip install 'yolotrain[export]'")

SIZE = 96
FIXTURE_IMAGES = Path(__file__).parent / "fixtures" / "data" / "coco_mini" / "images"


def installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


OPENVINO = pytest.mark.skipif(not installed("openvino", "nncf"), reason="pip install 'yolotrain[openvino]'")
# `make test` runs these in the LiteRT environment (.venv-litert) and deselects them elsewhere.
TFLITE = (pytest.mark.litert,
          pytest.mark.skipif(not installed("litert_torch", "ai_edge_litert"), reason="pip install 'yolotrain[tflite]'"))
COREML = pytest.mark.skipif(not installed("coremltools"), reason="pip install 'yolotrain[coreml]'")
TENSORRT = pytest.mark.skipif(tensorrt_unavailable() is not None, reason="needs a CUDA GPU and tensorrt")
NCNN = pytest.mark.skipif(not installed("pnnx", "ncnn"), reason="pip install 'yolotrain[ncnn]'")
MNN = pytest.mark.skipif(not installed("MNN"), reason="pip install 'yolotrain[mnn]'")
EXECUTORCH = pytest.mark.skipif(not installed("executorch"), reason="pip install 'yolotrain[executorch]'")
SUFFIX = {"onnx": ".onnx", "openvino": ".xml", "tflite": ".tflite", "engine": ".engine", "torchscript": ".torchscript",
          "ncnn": ".ncnn.param", "mnn": ".mnn", "executorch": ".pte"}
# (format, precision) → allowed |export - PyTorch| on scores and on boxes (px, 96 px input): fp32 runtimes
# agree to float32 rounding, fp16 keeps ~3 significant digits, int8 a few percent of the value range.
CASES = [
    pytest.param("onnx", "fp32", 1e-4, 1e-3, id="onnx-fp32"),
    pytest.param("onnx", "fp16", 5e-3, 0.5, id="onnx-fp16"),
    pytest.param("onnx", "int8", 0.05, 4.0, id="onnx-int8"),
    pytest.param("openvino", "fp32", 1e-4, 1e-3, id="openvino-fp32", marks=OPENVINO),
    pytest.param("openvino", "fp16", 5e-3, 0.5, id="openvino-fp16", marks=OPENVINO),
    pytest.param("openvino", "int8", 0.05, 4.0, id="openvino-int8", marks=OPENVINO),
    pytest.param("tflite", "fp32", 1e-4, 1e-3, id="tflite-fp32", marks=TFLITE),
    pytest.param("tflite", "fp16", 5e-3, 0.5, id="tflite-fp16", marks=TFLITE),
    pytest.param("tflite", "int8", 0.05, 4.0, id="tflite-int8", marks=TFLITE),
    pytest.param("torchscript", "fp32", 1e-4, 1e-3, id="torchscript-fp32"),
    pytest.param("ncnn", "fp32", 1e-4, 1e-3, id="ncnn-fp32", marks=NCNN),
    pytest.param("ncnn", "fp16", 5e-3, 0.5, id="ncnn-fp16", marks=NCNN),
    pytest.param("mnn", "fp32", 1e-4, 1e-3, id="mnn-fp32", marks=MNN),
    pytest.param("mnn", "fp16", 5e-3, 0.5, id="mnn-fp16", marks=MNN),
    pytest.param("executorch", "fp32", 1e-4, 1e-3, id="executorch-fp32", marks=EXECUTORCH),
    # GPU float32 kernels sum in another order than the CPU's.
    pytest.param("engine", "fp32", 1e-3, 1e-2, id="engine-fp32", marks=TENSORRT),
    pytest.param("engine", "fp16", 5e-3, 0.5, id="engine-fp16", marks=TENSORRT),
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A random-init detector whose objectness is biased up (so it detects), and a tiny shapes dataset."""
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2, names=["circle", "rectangle"]).eval()
    with torch.no_grad():
        for conv in model.head.m:
            conv.bias.view(3, 7)[:, 4].add_(6.0)
    folder = tmp_path_factory.mktemp("deploy")
    data = generate_shapes_dataset(root=folder / "shapes", n_train=4, n_val=4, img_size=SIZE)
    return model, data / "data.yaml", folder


def export_case(setup, fmt: str, precision: str, **options):
    model, data, folder = setup
    out = folder / f"{fmt}-{precision}{'-nms' if options.get('nms') else ''}{SUFFIX[fmt]}"
    if not out.exists():
        export(model, fmt, out=out, img_size=SIZE, dynamic_size=fmt in DYNAMIC_FORMATS, half=precision == "fp16",
               int8=precision == "int8", data=data, **options)
    return out


def torch_output(model: Yolov5, imgs: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return copy.deepcopy(model).fuse()(imgs)


def assert_same_detections(actual: torch.Tensor, expected: torch.Tensor, atol: float) -> None:
    """The same detections in any order: equal counts, and each row of either side has a row on the other
    within ``atol`` in every column (equal scores may come out in either order)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if len(actual):
        distance = (actual[:, None, :] - expected[None, :, :]).abs().amax(2)
        assert distance.min(1).values.max() <= atol and distance.min(0).values.max() <= atol, distance.min(1).values


@pytest.mark.parametrize(("fmt", "precision", "score_tol", "box_tol"), CASES)
def test_export_runs_in_its_runtime_like_torch(setup, fmt, precision, score_tol, box_tol):
    model, _, _ = setup
    path = export_case(setup, fmt, precision)
    runner = load_exported(path, trust_code=True)
    assert (runner.names, runner.num_classes, runner.img_size) == (["circle", "rectangle"], 2, (SIZE, SIZE))
    assert runner.precision == precision and not runner.end_to_end
    imgs = torch.rand(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    actual, expected = runner(imgs), torch_output(model, imgs)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual[..., 4:], expected[..., 4:], atol=score_tol, rtol=0)
    torch.testing.assert_close(actual[..., :4], expected[..., :4], atol=box_tol, rtol=0)
    if precision == "fp32":
        # Negative control: a 1% objectness error is caught by the fp32 tolerance.
        with pytest.raises(AssertionError):
            torch.testing.assert_close(actual[..., 4:] * 1.01, expected[..., 4:], atol=score_tol, rtol=0)


@pytest.mark.parametrize(("fmt", "precision"), [("onnx", "fp16"), ("onnx", "int8"),
                                                pytest.param("openvino", "fp32", marks=OPENVINO),
                                                pytest.param("openvino", "int8", marks=OPENVINO),
                                                pytest.param("tflite", "fp32", marks=TFLITE),
                                                pytest.param("tflite", "int8", marks=TFLITE),
                                                ("torchscript", "fp32"),
                                                pytest.param("ncnn", "fp32", marks=NCNN),
                                                pytest.param("mnn", "fp32", marks=MNN),
                                                pytest.param("executorch", "fp32", marks=EXECUTORCH),
                                                pytest.param("engine", "fp32", marks=TENSORRT)])
def test_val_and_predict_run_exports_through_their_runtime(setup, fmt, precision):
    model, data, _ = setup
    path = export_case(setup, fmt, precision)
    rect = fmt in DYNAMIC_FORMATS  # LiteRT and TorchScript graphs are fixed at one size: val letterboxes square
    # The PyTorch side in float32, as the exports compared with it (half=None would be bf16 on some CPUs).
    ours = val(model, str(data), img_size=SIZE, batch_size=4, workers=0, rect=rect, verbose=False, plots=False,
               half=False)
    theirs = val(str(path), str(data), img_size=SIZE, batch_size=4, workers=0, verbose=False, plots=False,
                 trust_code=True)
    tolerance = 1e-3 if precision == "fp32" else 0.05
    assert ours.map50 > 0
    assert theirs.map50 == pytest.approx(ours.map50, abs=tolerance)
    assert theirs.map == pytest.approx(ours.map, abs=tolerance)

    images = sorted((data.parent / "images" / "val").iterdir())[:2]
    expected = predict(model, images, img_size=SIZE, conf=0.3, half=False)
    actual = predict(path, images, img_size=SIZE, conf=0.3, trust_code=True)
    assert sum(len(r.boxes) for r in expected) > 0
    for a, b in zip(expected, actual):
        assert b.names == ["circle", "rectangle"]
        if precision == "fp32" and rect:
            assert len(a.boxes) == len(b.boxes) and torch.equal(a.classes, b.classes)
            torch.testing.assert_close(b.boxes, a.boxes, atol=0.05, rtol=1e-4)
        else:
            assert len(b.boxes) > 0


@pytest.mark.parametrize("fmt", [pytest.param("ncnn", marks=NCNN), pytest.param("mnn", marks=MNN)])
def test_runtimes_read_batches_of_any_memory_layout(setup, fmt):
    """predict hands a runtime channels-last batches, which it copies into the layout the runtime reads. NCNN's
    input wraps that copy's memory without holding it: the copy was freed before NCNN read it, and about one call
    in eight computed garbage (scores of 1.0). Each call here comes after freed memory was written again."""
    runner = load_exported(export_case(setup, fmt, "fp32"))
    imgs = torch.rand(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(2))
    expected = runner(imgs)
    for _ in range(40):
        actual = runner(imgs.contiguous(memory_format=torch.channels_last))
        overwritten = [np.full((3, SIZE, SIZE), 1e4, np.float32) for _ in range(3)]  # reuses what was freed
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)
        del overwritten


def test_optimize_writes_torchscript_the_lite_interpreter_runs_like_torch(setup, tmp_path):
    """``--optimize`` (the reference's TorchScript for PyTorch Mobile): the file loads in the lite interpreter and in
    our runtime, both computing PyTorch's output, and val on it scores as the plain TorchScript export does."""
    from torch.jit.mobile import _load_for_lite_interpreter

    model, data, folder = setup
    path = tmp_path / "mobile.torchscript"
    assert run_export(parse(["--weights", str(save_checkpoint(tmp_path / "best", model)), "--format", "torchscript",
                             "--optimize", "--img-size", str(SIZE), "--output", str(path)])) == 0
    runner = load_exported(path, trust_code=True)
    assert read_torchscript_metadata(path)["mobile"] in ("xnnpack", "frozen")
    assert runner.names == ["circle", "rectangle"]
    imgs = torch.rand(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    expected = torch_output(model, imgs)
    torch.testing.assert_close(runner(imgs), expected, atol=1e-4, rtol=1e-5)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Lite Interpreter is deprecated")
        lite = _load_for_lite_interpreter(str(path))
    with torch.inference_mode():
        torch.testing.assert_close(torch.cat([lite(image[None]) for image in imgs]), expected, atol=1e-4, rtol=1e-5)
    plain = export_case(setup, "torchscript", "fp32")
    scores = [val(str(p), str(data), img_size=SIZE, batch_size=4, workers=0, verbose=False, plots=False,
                  trust_code=True) for p in (path, plain)]
    assert scores[0].map50 > 0 and scores[0].map == pytest.approx(scores[1].map, abs=1e-4)


@OPENVINO
def test_openvino_compiles_a_repeated_shape_for_itself(setup):
    """A shape that comes twice in a row gets its own compiled model, which computes what the
    any-shape model computes; the oldest is dropped beyond the limit."""
    path = export_case(setup, "openvino", "fp32")
    runner = load_exported(path)
    generator = torch.Generator().manual_seed(2)
    wide, tall = torch.rand(1, 3, 64, SIZE, generator=generator), torch.rand(1, 3, SIZE, 64, generator=generator)
    general = runner(wide)
    assert not runner._specialised
    specialised = runner(wide)
    assert list(runner._specialised) == [(1, 3, 64, SIZE)]
    torch.testing.assert_close(specialised, general, atol=1e-4, rtol=0)
    runner(tall), runner(wide)  # alternating shapes compile nothing new
    assert list(runner._specialised) == [(1, 3, 64, SIZE)]
    for side in (32, 128, 160, 192):
        square = torch.rand(1, 3, side, side, generator=generator)
        runner(square), runner(square)
    assert list(runner._specialised) == [(1, 3, s, s) for s in (32, 128, 160, 192)]


@pytest.mark.parametrize("precision", [pytest.param("fp16", marks=TFLITE), pytest.param("int8", marks=TFLITE)])
def test_tflite_reduced_precision_graph(setup, precision):
    """fp16: every convolution's weights stored as float16. int8: the backbone's convolutions run on
    int8 tensors, the head's output convolutions (the last three) stay float32."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(export_case(setup, "tflite", precision)))
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    convs = [op for op in interpreter._get_ops_details() if op["op_name"] == "CONV_2D"]
    assert len(convs) == 60  # yolov5n: 57 in the backbone and neck, 3 in the head
    if precision == "fp16":
        stored = {tensors[i]["dtype"] for op in interpreter._get_ops_details() if op["op_name"] == "DEQUANTIZE"
                  for i in op["inputs"]}
        assert stored == {np.float16}
        assert all(tensors[op["inputs"][1]]["dtype"] == np.float32 for op in convs)  # dequantized on load
    else:
        weights = [tensors[op["inputs"][1]]["dtype"] for op in convs]
        assert weights[:-3] == [np.int8] * 57 and weights[-3:] == [np.float32] * 3


def test_onnx_int8_keeps_head_decode_and_stem_in_float(setup):
    """The int8 ONNX graph: every convolution reads int8 weights except the stem, the head's output
    convolutions and the convolutions feeding them, and nothing after the head is quantized (box
    coordinates in pixels stay float)."""
    import onnx

    model, _, _ = setup
    graph = onnx.load(str(export_case(setup, "onnx", "int8"))).graph
    producers = {out: node for node in graph.node for out in node.output}
    initializers = {t.name: t for t in graph.initializer}
    head_channels = model.head.na * (model.head.nc + 5)

    def weight_quantized(conv) -> bool:
        return getattr(producers.get(conv.input[1]), "op_type", None) == "DequantizeLinear"

    def out_channels(conv) -> int:
        weight = conv.input[1]
        if weight in initializers:
            return initializers[weight].dims[0]
        return initializers[producers[weight].input[0]].dims[0]

    convs = [n for n in graph.node if n.op_type == "Conv"]
    head = [n for n in convs if out_channels(n) == head_channels]
    stem = [n for n in convs if n.input[0] == "images"]
    assert len(head) == len(model.head.m) and len(stem) == 1
    def computed_by(name: str):
        """The node computing a tensor, behind any quantize/dequantize pair."""
        node = producers[name]
        while node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            node = producers[node.input[0]]
        return node

    silus = [computed_by(n.input[0]) for n in head]  # each head convolution reads a SiLU's output
    assert {n.op_type for n in silus} == {"Mul"}
    feeding = [producers[name] for n in silus for name in n.input if producers[name].op_type == "Conv"]
    assert len(feeding) == len(head)
    kept = head + feeding + stem
    assert not any(weight_quantized(n) for n in kept)
    assert all(weight_quantized(n) for n in convs if n not in kept)  # the rest is int8

    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    after_head, pending = set(), [out for n in head for out in n.output]
    while pending:
        for node in consumers.get(pending.pop(), []):
            if node.name not in after_head:
                after_head.add(node.name)
                pending.extend(node.output)
    ops_after_head = {n.op_type for n in graph.node if n.name in after_head}
    assert {"Sigmoid", "Concat"} <= ops_after_head
    assert not ops_after_head & {"QuantizeLinear", "DequantizeLinear"}


@pytest.fixture(scope="module")
def official_images(coco128):
    """The official yolov5n and three coco128 images letterboxed to 160 x 192 (real scores: an untrained
    model's near-equal scores leave NMS free to keep either of two tied boxes)."""
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
    import cv2

    from yolotrain.data.augment import letterbox
    from yolotrain.interop import load_model

    files = sorted((coco128 / "images" / "train2017").glob("*.jpg"))[:3]
    boxed = [cv2.cvtColor(letterbox(cv2.imread(str(f)), (160, 192))[0], cv2.COLOR_BGR2RGB) for f in files]
    imgs = torch.from_numpy(np.stack(boxed)).permute(0, 3, 1, 2).float() / 255
    return load_model(YOLOV5N_WEIGHTS), imgs


@pytest.mark.parametrize("fmt", ["onnx", pytest.param("openvino", marks=OPENVINO)])
@pytest.mark.parametrize("multi_label", [False, True])
def test_nms_inside_matches_our_nms(tmp_path, official_images, fmt, multi_label):
    model, imgs = official_images
    settings = {"conf": 0.1, "iou": 0.5, "max_det": 40, "multi_label": multi_label}
    path = export(model, fmt, out=tmp_path / f"nms{SUFFIX[fmt]}", img_size=160, dynamic_size=True, nms=True,
                  **settings)
    runner = load_exported(path)
    assert runner.end_to_end and runner.nms_settings == settings
    decoded = torch_output(model, imgs)
    ours = non_max_suppression(decoded, 0.1, 0.5, multi_label=multi_label, max_det=40)
    theirs = runner.detections(imgs, 0.1, 0.5, 40, multi_label)  # batch 3, 160 x 192: dynamic axes
    assert sum(len(d) for d in ours) > 10
    for a, b in zip(ours, theirs):
        assert_same_detections(b, a, atol=2e-3)
    # Stricter thresholds, fewer detections and a class subset are exact filters of the built-in NMS ...
    stricter = runner.detections(imgs, 0.4, 0.5, 5, multi_label, classes=[0, 2])
    for a, b in zip(non_max_suppression(decoded, 0.4, 0.5, [0, 2], multi_label=multi_label, max_det=5), stricter):
        assert_same_detections(b, a, atol=2e-3)
    # ... looser ones cannot be answered, and the raw-prediction call is refused.
    with pytest.raises(ValueError, match="has NMS built in"):
        runner.detections(imgs, 0.05, 0.5, 40, multi_label)
    with pytest.raises(ValueError, match="NMS inside"):
        runner(imgs)


def test_predict_on_an_export_with_nms_inside_gives_the_models_detections(tmp_path, coco128):
    """``predict`` runs an export with NMS inside (at the settings built into it) as it runs the PyTorch model
    (official weights: an untrained model's tied scores leave NMS to break ties its own way)."""
    from yolotrain.interop import load_model

    model = load_model(YOLOV5N_WEIGHTS)
    path = export(model, "onnx", out=tmp_path / "nms.onnx", img_size=320, dynamic_size=True, nms=True,
                  conf=0.25, iou=0.45, max_det=300)
    images = sorted((coco128 / "images" / "train2017").glob("*.jpg"))[:4]
    theirs = predict(str(path), images, img_size=320, max_det=300, half=False)
    ours = predict(model, images, img_size=320, max_det=300, half=False)
    assert sum(len(r.boxes) for r in ours) > 5 and [r.path for r in theirs] == [r.path for r in ours]
    for a, b in zip(ours, theirs):
        assert torch.equal(a.classes, b.classes)
        torch.testing.assert_close(b.boxes, a.boxes, atol=0.05, rtol=1e-4)
        torch.testing.assert_close(b.scores, a.scores, atol=1e-3, rtol=1e-4)


@COREML
@pytest.mark.parametrize("half", [False, True])
def test_coreml_export_structure_and_metadata(setup, half):
    """Core ML programs cannot run on Linux: check the converted program, its I/O shapes and metadata."""
    import coremltools as ct

    model, _, folder = setup
    path = export(model, "coreml", out=folder / f"model-{half}.mlpackage", img_size=(64, 96), half=half)
    assert path.is_dir() and not [p for p in folder.iterdir() if p.name.startswith(".")]
    spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    assert spec.WhichOneof("Type") == "mlProgram"
    (inp,), (out,) = spec.description.input, spec.description.output
    assert (inp.name, list(inp.type.multiArrayType.shape)) == ("images", [1, 3, 64, 96])
    assert (out.name, list(out.type.multiArrayType.shape)) == ("output0", [1, 3 * (8 * 12 + 4 * 6 + 2 * 3), 7])
    meta = dict(spec.description.metadata.userDefined)
    assert json.loads(meta["class_names"]) == ["circle", "rectangle"] and json.loads(meta["img_size"]) == [64, 96]
    assert meta["precision"] == ("fp16" if half else "fp32")
    ops = {op.type for block in spec.mlProgram.functions["main"].block_specializations.values()
           for op in block.operations}
    assert "conv" in ops and "sigmoid" in ops
    with pytest.raises(CheckpointError, match="Core ML prediction needs macOS"):
        load_exported(path)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    return parser.parse_args(argv)


def leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in ("best.json", "best.safetensors", "empty"))


@pytest.mark.parametrize(("fmt", "expected"), [
    ("edgetpu", "`yolotrain export --format edgetpu --data DATA` writes (as --format tflite --int8)"),
])
def test_formats_made_by_tools_of_their_own_say_how_in_one_line(setup, tmp_path, fmt, expected):
    """The reference's edgetpu: its compiler cannot be installed beside ours, so the export says how to make
    it from one of ours (the command line writes edgetpu's int8 model itself, below)."""
    model, _, _ = setup
    with pytest.raises(ValueError, match="^[^\n]*$") as error:
        export(model, fmt, out=tmp_path / "model.bin", img_size=SIZE)
    assert expected in str(error.value) and list(tmp_path.iterdir()) == []


@pytest.mark.litert
@pytest.mark.skipif(not installed("litert_torch", "ai_edge_litert"), reason="pip install 'yolotrain[tflite]'")
def test_edgetpu_writes_the_int8_model_its_compiler_reads_and_says_how_to_compile_it(setup, tmp_path, capsys):
    model, data, _ = setup
    weights = save_checkpoint(tmp_path / "best", model)
    assert run_export(parse(["--weights", str(weights), "--format", "edgetpu", "--img-size", str(SIZE)])) == 1
    assert "int8 export needs calibration images" in capsys.readouterr().err
    assert run_export(parse(["--weights", str(weights), "--format", "edgetpu", "--data", str(data),
                             "--img-size", str(SIZE)])) == 0
    out, err = capsys.readouterr()
    path = tmp_path / "best_int8.tflite"
    assert out.strip() == str(path) and f"Edge TPU: compile it with `edgetpu_compiler -s {path}`" in err
    runner = load_exported(path)
    assert (runner.precision, runner.names) == ("int8", ["circle", "rectangle"])


def test_bad_export_requests_fail_in_one_line_without_files(setup, tmp_path, capsys, monkeypatch):
    model, data, _ = setup
    save_checkpoint(tmp_path / "best", model)
    weights = str(tmp_path / "best.json")
    (tmp_path / "empty").mkdir()
    cases = [
        (["--format", "keras"], "unknown export format 'keras'"),
        (["--format", "torchscript", "--half"],
         "fp16 (--half) export is available for coreml, engine, mnn, ncnn, onnx, openvino, tflite"),
        (["--format", "torchscript", "--nms"], "NMS inside (--nms) export is available for onnx, openvino"),
        (["--format", "onnx", "--optimize"], "mobile optimization (--optimize) export is available for torchscript, "
                                             "not onnx"),
        (["--format", "onnx", "--int8"], "int8 export needs calibration images"),
        (["--format", "onnx", "--int8", "--data", str(tmp_path / "empty")], "no images to calibrate on"),
        (["--format", "onnx", "--int8", "--data", str(tmp_path / "absent")], "no such file or folder"),
        (["--format", "onnx,openvino", "--output", str(tmp_path / "x.onnx")], "--output names one file"),
        (["--format", "onnx", "--nms", "--iou", "1.5"], "NMS settings out of range"),
    ]
    for extra, expected in cases:
        assert run_export(parse(["--weights", weights, "--img-size", "64", *extra])) == 1
        err = capsys.readouterr().err
        assert err.startswith("yolotrain export: error: ") and expected in err and err.count("\n") == 1, err
        assert leftovers(tmp_path) == []

    # A module of no task: the message names the tasks whose models export.
    with pytest.raises(ValueError, match=r"^only models of yolotrain's tasks \(classify, detect, obb, pose, segment\) "
                                         r"can be exported, got a Conv2d$"):
        export(torch.nn.Conv2d(3, 3, 1), "onnx", out=tmp_path / "conv.onnx")

    # A format whose package is missing: the install hint, and nothing written.
    monkeypatch.setitem(sys.modules, "openvino", None)
    assert run_export(parse(["--weights", weights, "--img-size", "64", "--format", "openvino"])) == 1
    err = capsys.readouterr().err
    assert "pip install 'yolotrain[openvino]'" in err and err.count("\n") == 1
    assert leftovers(tmp_path) == []


def test_failed_write_leaves_no_partial_file(setup, tmp_path, monkeypatch):
    model, _, _ = setup
    import onnx

    def broken_save(proto, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"half a model")
        raise OSError("disk full")

    monkeypatch.setattr(onnx, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        export(model, "onnx", out=tmp_path / "m.onnx", img_size=64)
    assert list(tmp_path.iterdir()) == []


def test_cli_exports_several_formats_and_precisions(setup, tmp_path, capsys):
    model, data, _ = setup
    save_checkpoint(tmp_path / "best", model)
    formats = "onnx,openvino" if installed("openvino", "nncf") else "onnx"
    assert run_export(parse(["--weights", str(tmp_path / "best.json"), "--img-size", "64", "--format", formats,
                             "--int8", "--data", str(data), "--calibration-images", "2"])) == 0
    written = capsys.readouterr().out.split()
    assert written == [str(tmp_path / f"best_int8{SUFFIX[f]}") for f in formats.split(",")]
    for path in written:
        assert load_exported(path).precision == "int8"


def test_exports_that_cannot_be_loaded_get_one_line_errors(tmp_path):
    for name, expected in [("absent.onnx", "no such file"), ("absent.xml", "no such file"),
                           ("model.trt", "not an exported model")]:
        with pytest.raises(CheckpointError) as info:
            load_exported(tmp_path / name)
        assert expected in str(info.value) and "\n" not in str(info.value)
    if installed("openvino"):
        (tmp_path / "lonely.xml").write_text("<net/>")
        with pytest.raises(CheckpointError, match="weights file lonely.bin is missing"):
            load_exported(tmp_path / "lonely.xml")
    (tmp_path / "garbage.torchscript").write_bytes(b"not a zip archive")
    with pytest.raises(CheckpointError) as info:
        load_exported(tmp_path / "garbage.torchscript", trust_code=True)
    assert "not a loadable TorchScript model" in str(info.value) and "\n" not in str(info.value)
    if installed("ncnn"):
        (tmp_path / "lonely.ncnn.param").write_text("7767517\n0 0\n")
        with pytest.raises(CheckpointError, match="weights file lonely.ncnn.bin is missing"):
            load_exported(tmp_path / "lonely.ncnn.param")
        (tmp_path / "lonely.ncnn.bin").write_bytes(b"")
        with pytest.raises(CheckpointError, match="metadata file lonely.ncnn.json is missing"):
            load_exported(tmp_path / "lonely.ncnn.param")
        (tmp_path / "lonely.ncnn.json").write_text("[]")
        with pytest.raises(CheckpointError, match="NCNN file without yolotrain metadata"):
            load_exported(tmp_path / "lonely.ncnn.param")
    if installed("executorch"):
        (tmp_path / "lonely.pte").write_bytes(b"not a program")
        with pytest.raises(CheckpointError, match="metadata file lonely.pte.json is missing"):
            load_exported(tmp_path / "lonely.pte")
        (tmp_path / "lonely.pte.json").write_text('{"producer": "yolotrain"}')
        with pytest.raises(CheckpointError) as info:
            load_exported(tmp_path / "lonely.pte")
        assert "not a loadable ExecuTorch program" in str(info.value) and "\n" not in str(info.value)
    if installed("MNN"):
        (tmp_path / "garbage.mnn").write_bytes(b"not an MNN model")
        with pytest.raises(CheckpointError) as info:
            load_exported(tmp_path / "garbage.mnn")
        assert "not a loadable MNN model" in str(info.value) and "\n" not in str(info.value)
    foreign = tmp_path / "foreign.torchscript"
    with pytest.warns(FutureWarning):  # TorchScript is deprecated upstream
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(foreign))
    with pytest.raises(CheckpointError, match="TorchScript file without yolotrain metadata"):
        load_exported(foreign, trust_code=True)


def test_tensorrt_without_cuda_or_package_is_a_one_line_error(setup, tmp_path, capsys, monkeypatch):
    """On a machine without a CUDA GPU or without tensorrt, exporting and loading an engine say which is
    missing in one line, and nothing is written."""
    model, _, _ = setup
    save_checkpoint(tmp_path / "best", model)
    argv = ["--weights", str(tmp_path / "best.json"), "--img-size", "64", "--format", "engine"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for module, missing in [(None, "here the 'tensorrt' package is not installed (pip install 'yolotrain[tensorrt]') "
                                   "and no CUDA GPU is visible"),
                            (types.ModuleType("tensorrt"), "here no CUDA GPU is visible to torch")]:
        monkeypatch.setitem(sys.modules, "tensorrt", module)
        assert run_export(parse(argv)) == 1
        err = capsys.readouterr().err
        assert err.startswith("yolotrain export: error: TensorRT engines are built and run on a CUDA GPU")
        assert missing in err and "export --format onnx" in err and err.count("\n") == 1, err
        assert leftovers(tmp_path) == []
        with pytest.raises(CheckpointError) as info:
            load_exported(tmp_path / "model.engine")
        assert missing in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", pytest.param("openvino", marks=OPENVINO)])
def test_official_yolov5n_nms_export_agrees_with_our_nms_on_coco128(tmp_path, fmt, coco128):
    """The end-to-end export of the official model at 640 keeps the detections our NMS keeps, image by image."""
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
    from yolotrain.eval.inference import load_inference_model
    from yolotrain.eval.val import build_val_loader

    data = coco128_subset(tmp_path / "data", 128, coco128)
    path = export(YOLOV5N_WEIGHTS, fmt, out=tmp_path / f"e2e{SUFFIX[fmt]}", img_size=640, dynamic_size=True,
                  nms=True, conf=0.25, iou=0.45, max_det=300)
    runner = load_exported(path)
    model, _ = load_inference_model(str(YOLOV5N_WEIGHTS), "cpu", half=False)  # the export is float32
    loader = build_val_loader(data, 80, 640, 16, rect=True, workers=0)
    boxes = 0
    with torch.inference_mode():
        for imgs, *_ in loader:
            for a, b in zip(non_max_suppression(model(imgs), 0.25, 0.45), runner.detections(imgs, 0.25, 0.45, 300)):
                assert_same_detections(b, a, atol=0.02)
                boxes += len(a)
    assert boxes > 500
