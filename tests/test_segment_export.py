"""Segmentation exports: ONNX, OpenVINO and TorchScript carry the prototype masks, their runtimes return
``(decoded, proto)`` like the PyTorch model, ``val`` and ``predict`` on them score as PyTorch does, and
what cannot carry masks is refused in one line."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
import torch
from conftest import YOLOV5N_WEIGHTS, coco128_subset
from test_eval_val import COCO128_SEG

from yolotrain import Yolov5, predict, val
from yolotrain.checkpoint import CheckpointError
from yolotrain.interop import export, load_exported

pytest.importorskip("onnxruntime", reason="needs the export extra: pip install 'yolotrain[export]'")

SIZE = 128
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
def segmenter() -> Yolov5:
    """A random segmentation model whose prototypes are of order 1 (a random Proto's are ~1e-7, below what
    fp16 resolves)."""
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=3, names=["a", "b", "c"], task="segment").eval()
    with torch.no_grad():
        model.head.proto.cv3.bn.bias.copy_(torch.randn(32))
    return model


def exported(model: Yolov5, folder, fmt: str, **options):
    out = folder / f"seg{SUFFIX[fmt]}"
    export(model, fmt, out=out, img_size=SIZE, dynamic_size=fmt != "torchscript", **options)
    return load_exported(out, trust_code=True)


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "half"), [("onnx", False), ("onnx", True),
                                           pytest.param("openvino", False, marks=OPENVINO),
                                           pytest.param("openvino", True, marks=OPENVINO), ("torchscript", False)])
def test_exports_return_decoded_predictions_and_prototypes_like_torch(segmenter, tmp_path, fmt, half):
    runner = exported(segmenter, tmp_path, fmt, half=half)
    assert (runner.task, runner.num_masks, runner.num_classes) == ("segment", 32, 3)
    # fp32 runtimes agree to float32 rounding, fp16 to ~3 significant digits (detection's tolerances).
    score_tol, box_tol = (5e-3, 0.5) if half else (1e-4, 1e-3)
    sizes = [(SIZE, SIZE), (96, 160)] if runner.dynamic_size else [(SIZE, SIZE)]
    for h, w in sizes:
        imgs = torch.rand(2, 3, h, w, generator=torch.Generator().manual_seed(h))
        decoded, proto = runner(imgs)
        with torch.inference_mode():
            expected_decoded, expected_proto = copy.deepcopy(segmenter).fuse()(imgs)
        assert decoded.shape == expected_decoded.shape == (2, 3 * sum((h // s) * (w // s) for s in (8, 16, 32)), 40)
        assert proto.shape == expected_proto.shape == (2, 32, h // 4, w // 4)
        torch.testing.assert_close(decoded[..., 4:], expected_decoded[..., 4:], atol=score_tol, rtol=score_tol)
        torch.testing.assert_close(decoded[..., :4], expected_decoded[..., :4], atol=box_tol, rtol=0)
        torch.testing.assert_close(proto, expected_proto, atol=score_tol * float(expected_proto.abs().max()),
                                   rtol=score_tol)


@pytest.mark.parametrize(("fmt", "options", "message"), [
    ("tflite", {}, "segmentation models export to executorch, mnn, ncnn, onnx, openvino, paddle, pb, saved_model, "
                   "tfjs, torchscript: tflite cannot carry"),
    ("onnx", {"raw": True}, "--raw is for detection models"),
    ("onnx", {"nms": True}, "--nms is for detection models"),
    ("openvino", {"int8": True, "data": "unused"}, "int8 export is for detection models"),
])
def test_what_cannot_carry_masks_is_refused_in_one_line(segmenter, tmp_path, fmt, options, message):
    with pytest.raises(ValueError, match=message) as error:
        export(segmenter, fmt, out=tmp_path / f"x{SUFFIX.get(fmt, '.tflite')}", img_size=SIZE, **options)
    assert "\n" not in str(error.value) and not list(tmp_path.iterdir())


def test_metadata_that_contradicts_the_outputs_is_one_line(segmenter, tmp_path):
    """An export whose metadata claims another number of masks than its prototypes have is refused at load."""
    import onnx

    path = tmp_path / "seg.onnx"
    export(segmenter, "onnx", out=path, img_size=64, simplify=False)
    proto = onnx.load(str(path))
    next(p for p in proto.metadata_props if p.key == "nm").value = "16"
    onnx.save(proto, str(path))
    with pytest.raises(CheckpointError, match="nm 16") as error:
        load_exported(path)
    assert "\n" not in str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_val_and_predict_on_exports_score_as_pytorch(reference, tmp_path, fmt):
    """On coco128-seg images, an export of a segmentation model with real boxes gives PyTorch's box and mask
    metrics and the same masks in predict."""
    if not YOLOV5N_WEIGHTS.is_file() or not (COCO128_SEG / "images").is_dir():
        pytest.skip("needs the shared yolov5n.pt and coco128-seg")
    from segment_reference import our_segmenter, reference_segmenter

    model = our_segmenter(reference_segmenter(reference, YOLOV5N_WEIGHTS))
    data = coco128_subset(tmp_path / "data", 4, COCO128_SEG)
    runner_path = exported(model, tmp_path, fmt).path
    rect = fmt not in ("torchscript", "ncnn", "mnn", "executorch")  # graphs fixed at one size: val letterboxes square
    ours = val(model, data, img_size=SIZE, workers=0, rect=rect, verbose=False, plots=False, half=False)
    theirs = val(runner_path, data, img_size=SIZE, workers=0, verbose=False, plots=False, trust_code=True)
    assert ours.map50 > 0 and ours.masks.map50 > 0
    for a, b in ((ours, theirs), (ours.masks, theirs.masks)):
        assert (b.map50, b.map) == pytest.approx((a.map50, a.map), abs=1e-3)

    images = sorted((data.parent / "images" / "val").iterdir())[:2]
    expected = predict(model, images, img_size=SIZE, conf=0.3, half=False)
    actual = predict(runner_path, images, img_size=SIZE, conf=0.3, trust_code=True)
    assert sum(len(r.boxes) for r in expected) > 0
    for a, b in zip(expected, actual):
        assert b.masks.shape[1:] == a.masks.shape[1:]
        if rect:
            assert len(a.boxes) == len(b.boxes)
            assert (a.masks != b.masks).sum() <= 1e-3 * a.masks.size  # pixels on a mask's edge may tip
        else:
            assert len(b.boxes) > 0 and b.masks.dtype == np.bool_


def test_segmentation_model_and_its_export_are_detectors_with_masks(segmenter, tmp_path):
    from yolotrain import Detector, resolve_model

    path = tmp_path / "seg.onnx"
    export(segmenter, "onnx", out=path, img_size=64, simplify=False)
    for model in (segmenter, resolve_model(path)):
        assert isinstance(model, Detector) and (model.task, model.num_masks) == ("segment", 32)
    assert (Yolov5("n", num_classes=2).num_masks, load_exported(path).num_masks) == (0, 32)
