"""Export a detector for deployment (``yolotrain export``): ONNX, TorchScript, OpenVINO, LiteRT, Core ML,
TensorRT.

The exported graph is the fused model (BatchNorm folded into the convolutions) returning either the
decoded ``[B, N, 5+nc]`` output (cx, cy, w, h in input pixels, sigmoid objectness and class scores;
no NMS), with ``raw=True`` the raw head maps (one per level), or with ``nms=True`` the final detections
``[B, max_det, 6]`` (x1, y1, x2, y2, score, class; rows past the last detection are zeros).
Every export carries the class names, strides, anchors, image size, class count and precision:
ONNX in ``metadata_props``, OpenVINO in the IR's runtime info, LiteRT in a small archive appended
to the flatbuffer, Core ML in the model's user-defined metadata, TorchScript in ``config.json``,
TensorRT in a header before the engine.

Precision: ``half`` stores fp16 weights (ONNX: fp16 compute with float32 inputs and outputs and the
decode tail kept in float32; OpenVINO: fp16 weights; LiteRT: fp16 weights, float32 compute; Core ML:
fp16 compute; TensorRT: fp16 layers, the decode tail in float32); ``int8`` is post-training
static quantization calibrated on images from ``data`` (onnxruntime QDQ, OpenVINO via NNCF, LiteRT
int8 weights and activations via the AI Edge Quantizer), the decode tail left in float32, for ONNX
the head's convolutions, the layers feeding them and the stem too, for LiteRT the head's
convolutions (see :mod:`yolotrain.interop.calibration`).

Files are written under a temporary name in the destination folder and renamed at the end, so a
failed export leaves nothing behind.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..boxes import MAX_IMG_SIZE, xywh_to_xyxy
from ..checkpoint import CheckpointError
from ..eval.nms import check_nms_limits
from ..model import Yolov5
from ..outputs import dataset_inputs, refuse_overwriting_inputs, weights_inputs
from .calibration import DEFAULT_CALIBRATION_IMAGES, CalibrationImages, calibration_files
from .pretrained import load_model

FORMATS: dict[str, str] = {"onnx": ".onnx", "torchscript": ".torchscript", "openvino": ".xml",
                           "tflite": ".tflite", "coreml": ".mlpackage", "engine": ".engine"}
# What each format can do beyond plain float32.
HALF_FORMATS = frozenset({"onnx", "openvino", "tflite", "coreml", "engine"})
INT8_FORMATS = frozenset({"onnx", "openvino", "tflite"})
NMS_FORMATS = frozenset({"onnx", "openvino"})
RAW_FORMATS = frozenset({"onnx", "torchscript"})
# Formats whose graphs keep a free batch axis and image size (the others are fixed at img_size, batch 1).
DYNAMIC_FORMATS = frozenset({"onnx", "openvino", "engine"})
# Formats converted from our ONNX graph (the others are converted from the PyTorch module).
ONNX_BASED_FORMATS = frozenset({"onnx", "openvino", "engine"})
DEFAULT_OPSET = 17
DECODED_OUTPUT = "output0"
DETECTIONS_OUTPUT = "detections"
EXPORT_PACKAGES_HINT = "pip install 'yolotrain[export]'"
PACKAGE_HINTS = {"openvino": "pip install 'yolotrain[openvino]'", "tflite": "pip install 'yolotrain[tflite]'",
                 "coreml": "pip install 'yolotrain[coreml]'"}


class _NonMaxSuppression(torch.autograd.Function):
    """ONNX ``NonMaxSuppression``: per image and class, the boxes kept, as ``[K, 3]`` (image, class, box)
    rows. The forward is the same computation in PyTorch, so the traced module also runs eagerly."""

    @staticmethod
    def forward(ctx, boxes: torch.Tensor, scores: torch.Tensor, max_per_class: torch.Tensor,
                iou: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
        from torchvision.ops import nms

        rows = []
        for b, c in itertools.product(range(scores.shape[0]), range(scores.shape[1])):
            candidates = (scores[b, c] > score).nonzero().view(-1)
            kept = candidates[nms(boxes[b, candidates], scores[b, c, candidates], float(iou))][:int(max_per_class)]
            rows.append(torch.stack((torch.full_like(kept, b), torch.full_like(kept, c), kept), 1))
        return torch.cat(rows) if rows else torch.zeros(0, 3, dtype=torch.long)

    @staticmethod
    def symbolic(g, boxes, scores, max_per_class, iou, score):
        return g.op("NonMaxSuppression", boxes, scores, max_per_class, iou, score, center_point_box_i=0)


class _ExportGraph(nn.Module):
    """What gets traced: images → decoded output, → the raw maps as a tuple, or → final detections."""

    def __init__(self, model: Yolov5, raw: bool, nms: dict | None = None) -> None:
        super().__init__()
        self.model = model
        self.raw = raw
        self.nms = nms

    def forward(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        maps = self.model.forward_maps(images)
        if self.raw:
            return tuple(maps)
        decoded = self.model.head.decode(maps)
        return decoded if self.nms is None else self._detections(decoded)

    def _detections(self, pred: torch.Tensor) -> torch.Tensor:
        """Decoded output → ``[B, max_det, 6]``, the semantics of :func:`yolotrain.eval.non_max_suppression`
        (objectness and score above ``conf``, class-aware NMS, the ``max_det`` best per image) in fixed
        shapes: the kept (image, class, box) triples are marked in a dense score map whose ``max_det``
        largest entries are the detections."""
        conf, max_det = self.nms["conf"], self.nms["max_det"]
        boxes = xywh_to_xyxy(pred[..., :4])
        objectness = pred[..., 4:5]
        scores = pred[..., 5:] * objectness * (objectness > conf)
        if not self.nms["multi_label"]:  # only each box's best class is a candidate
            classes = torch.arange(scores.shape[2], device=scores.device)
            scores = scores * (classes == scores.argmax(2, keepdim=True))
        scores = scores.transpose(1, 2)  # [B, C, N], as ONNX's NonMaxSuppression takes them
        kept = _NonMaxSuppression.apply(boxes, scores, torch.tensor([max_det]), torch.tensor([self.nms["iou"]]),
                                        torch.tensor([conf]))
        marks = torch.zeros_like(scores)
        marks[kept[:, 0], kept[:, 1], kept[:, 2]] = 1.0
        batch, num_classes, num_boxes = scores.shape
        # max_det zero columns: top-k stays defined when fewer than max_det pairs exist at small sizes.
        flat = torch.cat(((scores * marks).flatten(1), scores.new_zeros(batch, max_det)), 1)
        top, index = flat.topk(max_det, 1)
        box_index = index % num_boxes
        top_boxes = boxes.gather(1, box_index.unsqueeze(2).expand(-1, -1, 4))
        top_classes = torch.div(index, num_boxes, rounding_mode="floor").clamp(max=num_classes - 1)
        return torch.cat((top_boxes * (top > 0).unsqueeze(2), top.unsqueeze(2), top_classes.unsqueeze(2).to(top)), 2)


def raw_output_names(model: Yolov5) -> tuple[str, ...]:
    """Names of the raw head maps: ``p3``, ``p4``, ``p5`` (and ``p6`` on P6 models), by level stride."""
    return tuple(f"p{int(s).bit_length() - 1}" for s in model.head.stride.tolist())


def _image_size(img_size: int | Sequence[int], stride: int = 32) -> tuple[int, int]:
    size = (int(img_size), int(img_size)) if isinstance(img_size, int) else tuple(int(s) for s in img_size)
    if len(size) == 1:
        size = (size[0], size[0])
    if len(size) != 2 or any(s <= 0 or s % stride for s in size):
        raise ValueError(f"img_size must be one or two positive multiples of {stride}, got {img_size!r}")
    if max(size) > MAX_IMG_SIZE:
        raise ValueError(f"img_size must be at most {MAX_IMG_SIZE}, got {img_size!r}")
    return size


def export_metadata(model: Yolov5, size: tuple[int, int], raw: bool, dynamic_batch: bool,
                    dynamic_size: bool, precision: str = "fp32", nms: dict | None = None) -> dict[str, str]:
    """String metadata stored with an export (read back by :class:`~yolotrain.interop.runtime.ExportedModel`)."""
    head = model.head
    anchors = (head.anchors * head.stride.view(-1, 1, 1)).tolist()
    names = list(getattr(model, "names", None) or [str(i) for i in range(head.nc)])
    metadata = {
        "producer": "yolotrain", "model": f"yolov5{model.version}", "nc": str(head.nc), "names": json.dumps(names),
        "stride": json.dumps([int(s) for s in head.stride.tolist()]), "anchors": json.dumps(anchors),
        "img_size": json.dumps(list(size)), "raw": json.dumps(raw), "dynamic_batch": json.dumps(dynamic_batch),
        "dynamic_size": json.dumps(dynamic_size), "precision": precision,
    }
    if nms is not None:
        metadata["nms"] = json.dumps(nms)
    return metadata


def _load(weights_or_model: str | Path | Yolov5) -> Yolov5:
    if isinstance(weights_or_model, nn.Module):
        if not isinstance(weights_or_model, Yolov5):
            raise ValueError(f"only Yolov5 detectors can be exported, got {type(weights_or_model).__name__}")
        # A copy: fusing replaces the BatchNorms, which must not happen to the caller's (maybe training) model.
        model = copy.deepcopy(weights_or_model)
    else:
        model = load_model(weights_or_model)
    return model.float().cpu().eval().fuse()


def default_output(weights: str | Path, fmt: str, half: bool = False, int8: bool = False) -> Path:
    """The weights path with the format's suffix, ``_fp16``/``_int8`` marking a reduced precision."""
    weights = Path(weights)
    name = weights.name.removesuffix(".json").removesuffix(".safetensors").removesuffix(".pt")
    return weights.with_name(name + ("_fp16" if half else "_int8" if int8 else "") + FORMATS[fmt])


def _check_options(fmt: str, half: bool, int8: bool, raw: bool, nms: bool, data: Any) -> None:
    """One-line errors for requests no format-specific code should see."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if half and int8:
        raise ValueError("choose one of half and int8")
    for asked, supported, what in ((half, HALF_FORMATS, "fp16 (--half)"), (int8, INT8_FORMATS, "int8 (--int8)"),
                                   (nms, NMS_FORMATS, "NMS inside (--nms)"), (raw, RAW_FORMATS, "raw outputs (--raw)")):
        if asked and fmt not in supported:
            raise ValueError(f"{what} export is available for {', '.join(sorted(supported))}, not {fmt}")
    if raw and nms:
        raise ValueError("raw outputs and NMS inside exclude each other")
    if int8 and data is None:
        raise ValueError("int8 export needs calibration images: pass data= (--data DATASET)")
    if fmt == "engine":
        from .tensorrt_backend import tensorrt_unavailable

        reason = tensorrt_unavailable()
        if reason is not None:
            raise ImportError(f"{reason}: export --format onnx, or run this export on the GPU machine")


def export(weights_or_model: str | Path | Yolov5, fmt: str = "onnx", out: str | Path | None = None,
           img_size: int | Sequence[int] | None = None, dynamic_batch: bool = True, dynamic_size: bool = False,
           simplify: bool = True, raw: bool = False, opset: int = DEFAULT_OPSET, half: bool = False,
           int8: bool = False, data: str | os.PathLike | None = None,
           calibration_images: int = DEFAULT_CALIBRATION_IMAGES, nms: bool = False, conf: float = 0.25,
           iou: float = 0.45, max_det: int = 300, multi_label: bool = False) -> Path:
    """Export a checkpoint path or a :class:`Yolov5` to ``fmt`` (one of :data:`FORMATS`).

    ``out`` defaults to the weights path with the format's suffix (see :func:`default_output`).
    ONNX and OpenVINO graphs keep a dynamic batch axis unless ``dynamic_batch=False`` and dynamic
    height and width with ``dynamic_size=True``; LiteRT and Core ML graphs are fixed at batch 1 and
    ``img_size``. ONNX exports use opset ``opset`` (17 or later) and are simplified with onnxslim
    unless ``simplify=False``. ``half`` / ``int8`` choose the precision (``int8`` calibrates on up to
    ``calibration_images`` images from the dataset or image folder ``data``); ``nms=True`` builds
    non-maximum suppression with ``conf``, ``iou``, ``max_det`` and ``multi_label`` into the graph.
    ``img_size`` defaults to the model's training size (640; 1280 for P6 models). Returns the written path.
    """
    _check_options(fmt, half, int8, raw, nms, data)
    if opset < DEFAULT_OPSET:
        raise ValueError(f"opset must be {DEFAULT_OPSET} or later, got {opset}")
    if not (0.0 <= conf <= 1.0 and 0.0 <= iou <= 1.0):
        raise ValueError(f"NMS settings out of range: conf {conf} and iou {iou} in [0, 1]")
    check_nms_limits(max_det)
    if out is None and isinstance(weights_or_model, nn.Module):
        raise ValueError("out= is required when exporting a model object")
    out = Path(out) if out is not None else default_output(weights_or_model, fmt, half, int8)
    if fmt in ("openvino", "coreml", "engine") and out.suffix != FORMATS[fmt]:
        raise ValueError(f"{fmt} output must end in {FORMATS[fmt]}, got {out.name}")
    model = _load(weights_or_model)
    size = _image_size(model.default_img_size if img_size is None else img_size, model.max_stride)
    calibration_set = calibration_files(data, calibration_images) if int8 else []
    calibration = CalibrationImages(calibration_set, size) if int8 else None
    nms_settings = {"conf": conf, "iou": iou, "max_det": max_det, "multi_label": multi_label} if nms else None
    graph = _ExportGraph(model, raw, nms_settings).eval()
    if fmt not in DYNAMIC_FORMATS:
        dynamic_batch = dynamic_size = False
    precision = "fp16" if half else "int8" if int8 else "fp32"
    metadata = export_metadata(model, size, raw, dynamic_batch, dynamic_size, precision, nms_settings)
    example = torch.zeros(1, model.in_channels, *size)
    written = [("--output", out)] + ([("--output", out.with_suffix(".bin"))] if fmt == "openvino" else [])
    weights = [] if isinstance(weights_or_model, nn.Module) else weights_inputs(weights_or_model)
    refuse_overwriting_inputs(written, weights + dataset_inputs(calibration_set, data if int8 else None))
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # The input-shape checks in forward_maps are Python conditions the tracer reports as constants.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        if fmt in ONNX_BASED_FORMATS:
            proto = _onnx_proto(graph, example, dynamic_batch, dynamic_size, simplify, opset)
            if fmt == "onnx":
                _write_onnx(proto, out, metadata, half, calibration)
            elif fmt == "openvino":
                _write_openvino(proto, out, metadata, half, calibration)
            else:
                _write_engine(proto, out, metadata, half, size, model.max_stride)
        elif fmt == "tflite":
            _write_tflite(graph, example, out, metadata, half, calibration)
        elif fmt == "coreml":
            _write_coreml(graph, example, out, metadata, half)
        else:
            _write_torchscript(graph, example, out, metadata)
    return out


@contextlib.contextmanager
def _staged(out: Path, suffixes: Sequence[str] = ("",)) -> Iterator[Path]:
    """A temporary path beside ``out`` to write to; on success it (and its siblings with ``suffixes``
    replacing the suffix, e.g. OpenVINO's ``.bin``) is renamed onto ``out``, on failure removed."""
    folder = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    staged = folder / out.name
    try:
        yield staged
        # The companions first: a reader finds the main file only once everything it points to is there.
        for suffix in sorted(suffixes, key=lambda s: s in ("", out.suffix)):
            source, target = (staged.with_suffix(suffix), out.with_suffix(suffix)) if suffix else (staged, out)
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(source, target)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _dynamic_axes(raw: tuple[str, ...] | None, dynamic_batch: bool, dynamic_size: bool,
                  nms: bool) -> dict[str, dict[int, str]]:
    batch = {0: "batch"} if dynamic_batch else {}
    axes = {"images": batch | ({2: "height", 3: "width"} if dynamic_size else {})}
    if raw:
        axes.update({name: batch | ({2: f"grid_height{level}", 3: f"grid_width{level}"} if dynamic_size else {})
                     for level, name in enumerate(raw)})
    elif nms:
        axes.update({DETECTIONS_OUTPUT: batch})
    else:
        axes.update({DECODED_OUTPUT: batch | ({1: "predictions"} if dynamic_size else {})})
    return {name: value for name, value in axes.items() if value}


def _onnx_module():
    try:
        import onnx
    except ImportError:
        raise ImportError(f"ONNX export needs the 'onnx' package ({EXPORT_PACKAGES_HINT})") from None
    return onnx


def _onnx_proto(graph: _ExportGraph, example: torch.Tensor, dynamic_batch: bool, dynamic_size: bool,
                simplify: bool, opset: int) -> Any:
    """The traced float32 graph as an ONNX ``ModelProto`` (OpenVINO converts from it too)."""
    onnx = _onnx_module()
    raw_names = raw_output_names(graph.model) if graph.raw else None
    outputs = list(raw_names) if raw_names else [DETECTIONS_OUTPUT] if graph.nms else [DECODED_OUTPUT]
    with tempfile.TemporaryDirectory(prefix="yolotrain-export-") as folder:
        traced = Path(folder) / "traced.onnx"
        with warnings.catch_warnings():
            # The TorchScript-based exporter: the dynamo one needs onnxscript, which is not a
            # dependency, so its deprecation notices are expected here.
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(graph, (example,), str(traced), dynamo=False, opset_version=opset,
                              input_names=["images"], output_names=outputs, do_constant_folding=True,
                              dynamic_axes=_dynamic_axes(raw_names, dynamic_batch, dynamic_size,
                                                         graph.nms is not None))
        proto = onnx.load(str(traced))
    return _simplify(proto) if simplify else proto


def _simplify(proto: Any) -> Any:
    try:
        import onnxslim
    except ImportError:
        raise ImportError(f"simplifying the ONNX graph needs 'onnxslim' ({EXPORT_PACKAGES_HINT}), "
                          "or pass simplify=False / --no-simplify") from None
    return onnxslim.slim(proto)


def _write_onnx(proto: Any, out: Path, metadata: dict[str, str], half: bool,
                calibration: CalibrationImages | None) -> None:
    onnx = _onnx_module()
    if half:
        proto = _onnx_fp16(proto)
    with _staged(out) as staged:
        if calibration is not None:
            _onnx_int8(proto, staged, calibration)
            proto = onnx.load(str(staged))
        for key, value in metadata.items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.checker.check_model(proto)
        onnx.save(proto, str(staged))


def _onnx_fp16(proto: Any) -> Any:
    """fp16 weights and arithmetic; float32 inputs and outputs, and the decode tail kept in float32."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from .calibration import onnx_decode_tail

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # values clipped to the fp16 range are reported per tensor
        converted = convert_float_to_float16(proto, keep_io_types=True, node_block_list=onnx_decode_tail(proto))
    _sort_nodes(converted.graph)
    return converted


def _sort_nodes(graph: Any) -> None:
    """Put the nodes in topological order (the fp16 converter appends its input casts at the end)."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        runnable = [all(i in ready for i in n.input) for n in pending]
        if not any(runnable):
            raise ValueError("the converted ONNX graph has a cycle or an undefined input")
        ordered += [n for n, ok in zip(pending, runnable) if ok]
        ready.update(o for n, ok in zip(pending, runnable) if ok for o in n.output)
        pending = [n for n, ok in zip(pending, runnable) if not ok]
    del graph.node[:]
    graph.node.extend(ordered)


# onnxruntime int8: QDQ, int8 weights per channel, uint8 activations with min/max ranges; which nodes stay
# float was chosen on official yolov5n, coco128 at 640 px (calibrated on its 128 images), mAP50-95
# against 0.3620 in float32. Float nodes beyond the decode tail:
#   none                                                         0.3379 (-0.0241)
#   head convolutions                                            0.3451 (-0.0169)
#   head convolutions and stem                                   0.3458 (-0.0163)
#   head convolutions and the layers feeding them                0.3412 (-0.0208)
#   head convolutions, the layers feeding them and stem (kept)   0.3495 (-0.0125)
#   head convolutions and every SiLU                             0.3506 (-0.0115), 1.4x slower
# Entropy ranges (0.3374 with the head in float) and moving-average min/max (0.3413 with head and stem)
# did worse. Percentile ranges (99.999, head and stem in float) scored 0.3408 to 0.3536 depending only on
# how many images onnxruntime histograms at once (4, 8, 16, 32: it bins by the first chunk's range),
# which is too fragile to rely on; range changes that small move mAP by ~0.005 either way, so smaller
# differences between the rows above mean little. Calibrated on coco128's first 64 images, the kept
# setting loses 0.0021 on the other 64 (0.3767 against 0.3788). Where a fed layer's output also feeds
# the next stage (P3, P4), onnxruntime quantizes it for both readers; giving the head the float tensor
# instead scored the same (0.3497). The kept nodes cost little time: the stem is one convolution, the
# rest run at 1/8 to 1/32 of the input resolution.


def _onnx_int8(proto: Any, out: Path, calibration: CalibrationImages) -> None:
    """Static QDQ quantization (int8 weights per channel, uint8 activations) calibrated by min/max;
    the decode tail, the head's convolutions and the layers feeding them, and the stem stay float32."""
    try:
        from onnxruntime.quantization import QuantFormat, QuantType, quant_pre_process, quantize_static
    except ImportError:
        raise ImportError(f"int8 ONNX export needs 'onnxruntime' ({EXPORT_PACKAGES_HINT})") from None
    onnx = _onnx_module()

    from .calibration import OnnxCalibrationReader, onnx_int8_float_nodes

    prepared = out.with_name(out.name + ".prepared.onnx")
    onnx.save(proto, str(prepared))
    quant_pre_process(str(prepared), str(prepared), skip_symbolic_shape=True)
    float_nodes = onnx_int8_float_nodes(onnx.load(str(prepared)))
    reader = OnnxCalibrationReader(calibration, proto.graph.input[0].name)
    quantize_static(str(prepared), str(out), reader, quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_exclude=float_nodes)
    prepared.unlink()


def _write_openvino(proto: Any, out: Path, metadata: dict[str, str], half: bool,
                    calibration: CalibrationImages | None) -> None:
    from .openvino_backend import RT_INFO_SECTION, openvino_module

    ov = openvino_module()
    onnx = _onnx_module()
    with _staged(out, (".xml", ".bin")) as staged:
        source = staged.with_name("source.onnx")
        onnx.save(proto, str(source))
        model = ov.convert_model(str(source))
        source.unlink()
        if calibration is not None:
            model = _openvino_int8(model, calibration)
        for key, value in metadata.items():
            model.set_rt_info(value, [RT_INFO_SECTION, key])
        ov.save_model(model, str(staged), compress_to_fp16=half)


def _openvino_int8(model: Any, calibration: CalibrationImages) -> Any:
    try:
        import nncf
    except ImportError:
        raise ImportError(f"int8 OpenVINO export needs 'nncf' ({PACKAGE_HINTS['openvino']})") from None
    from .calibration import openvino_decode_tail

    nncf.set_log_level(40)  # errors only: its progress bars and notes are not ours to print
    dataset = nncf.Dataset(calibration)
    scope = nncf.IgnoredScope(names=openvino_decode_tail(model), validate=False)
    with contextlib.redirect_stdout(sys.stderr):  # its progress bars
        return nncf.quantize(model, dataset, subset_size=len(calibration), preset=nncf.QuantizationPreset.MIXED,
                             ignored_scope=scope)


def _write_engine(proto: Any, out: Path, metadata: dict[str, str], half: bool, size: tuple[int, int],
                  min_side: int) -> None:
    from .calibration import onnx_decode_tail
    from .tensorrt_backend import build_engine

    with _staged(out) as staged:
        build_engine(proto, staged, metadata, half, size, min_side, onnx_decode_tail(proto) if half else [])


def _write_tflite(graph: _ExportGraph, example: torch.Tensor, out: Path, metadata: dict[str, str], half: bool,
                  calibration: CalibrationImages | None) -> None:
    try:
        import litert_torch
    except ImportError:
        raise ImportError(f"LiteRT export needs 'litert-torch' ({PACKAGE_HINTS['tflite']})") from None
    from .tflite_backend import METADATA_NAME

    with _staged(out) as staged, contextlib.redirect_stdout(sys.stderr):  # the converter prints progress
        litert_torch.convert(graph, (example,)).export(str(staged))
        if half or calibration is not None:
            _tflite_quantized(staged, calibration)
        with zipfile.ZipFile(staged, "a") as archive:
            archive.writestr(METADATA_NAME, json.dumps(metadata))


def _tflite_quantized(path: Path, calibration: CalibrationImages | None) -> None:
    """Rewrite the float LiteRT model at ``path`` with fp16 weights (``calibration`` None) or int8 weights
    and activations calibrated on ``calibration``, the head's convolutions and decode tail in float."""
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import qtyping, quantizer
    from ai_edge_quantizer.algorithm_manager import AlgorithmName

    from .calibration import TFLITE_FLOAT_SCOPES, TfliteCalibrationInputs

    every_op = qtyping.TFLOperationName.ALL_SUPPORTED
    model = quantizer.Quantizer(path.read_bytes())
    if calibration is None:
        model.add_weight_only_config(regex=".*", operation_name=every_op, num_bits=16,
                                     algorithm_key=AlgorithmName.FLOAT_CASTING)
        ranges = None
    else:
        model.add_static_config(regex=".*", operation_name=every_op, activation_num_bits=8, weight_num_bits=8)
        model.update_quantization_recipe(regex=TFLITE_FLOAT_SCOPES, operation_name=every_op,
                                         algorithm_key=AlgorithmName.NO_QUANTIZE)
        signature, inputs = next(iter(Interpreter(model_path=str(path)).get_signature_list().items()))
        (name,) = inputs["inputs"]
        with warnings.catch_warnings():  # calibration keeps every tensor on purpose; its interpreter warns about that
            warnings.filterwarnings("ignore", message=".*experimental_preserve_all_tensors")
            ranges = model.calibrate({signature: TfliteCalibrationInputs(calibration, name)},
                                     num_threads=os.cpu_count())
    result = model.quantize(ranges, enable_progress_report=False)
    path.unlink()
    result.export_model(str(path))


def _write_coreml(graph: _ExportGraph, example: torch.Tensor, out: Path, metadata: dict[str, str],
                  half: bool) -> None:
    try:
        import coremltools as ct
    except ImportError:
        raise ImportError(f"Core ML export needs 'coremltools' ({PACKAGE_HINTS['coreml']})") from None
    precision = ct.precision.FLOAT16 if half else ct.precision.FLOAT32
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        # coremltools warns that it was not tested with this torch version; the structure test covers it.
        warnings.simplefilter("ignore")
        logging.getLogger("coremltools").setLevel(logging.ERROR)
        program = torch.export.export(graph, (example,)).run_decompositions({})
        mlmodel = ct.convert(program, inputs=[ct.TensorType(name="images", shape=tuple(example.shape))],
                             outputs=[ct.TensorType(name=DETECTIONS_OUTPUT if graph.nms else DECODED_OUTPUT)],
                             convert_to="mlprogram", compute_precision=precision,
                             minimum_deployment_target=ct.target.iOS16)
    mlmodel.user_defined_metadata.update(metadata)
    mlmodel.short_description = f"yolotrain {metadata['model']} detector, {metadata['nc']} classes"
    with _staged(out) as staged:
        mlmodel.save(str(staged))


def _write_torchscript(graph: _ExportGraph, example: torch.Tensor, out: Path, metadata: dict[str, str]) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        # TorchScript is deprecated upstream but still what C++/mobile deployments load; the user asked for it.
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        traced = torch.jit.trace(graph, example, strict=False, check_trace=False)
        with _staged(out) as staged:
            torch.jit.save(traced, str(staged), _extra_files={"config.json": json.dumps(metadata)})


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``yolotrain export``."""
    parser.add_argument("--weights", required=True, help="checkpoint: ours (.safetensors/.json), a state dict, "
                        "or an official YOLOv5 .pt")
    parser.add_argument("--format", default="onnx", help=f"export format, or a comma list: {', '.join(FORMATS)} "
                        "(default: onnx)")
    parser.add_argument("--output", default=None, help="output file (default: the weights path with the "
                        "format's suffix; one format only)")
    parser.add_argument("--img-size", type=int, nargs="+", default=None, metavar="N",
                        help="example image size: one side or height width, multiples of the largest stride "
                        "(default: 640; 1280 for P6 models)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset (default: {DEFAULT_OPSET})")
    parser.add_argument("--static-batch", action="store_true", help="fix the batch size to 1 (ONNX, OpenVINO, "
                        "TensorRT)")
    parser.add_argument("--dynamic-size", action="store_true", help="dynamic image height and width "
                        "(ONNX, OpenVINO, TensorRT)")
    parser.add_argument("--no-simplify", action="store_true", help="skip onnxslim graph simplification")
    parser.add_argument("--raw", action="store_true", help="output the raw head maps (one per level) instead of "
                        "decoded boxes (ONNX, TorchScript)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--half", action="store_true", help="fp16 weights (ONNX, OpenVINO, LiteRT, "
                           "Core ML, TensorRT)")
    precision.add_argument("--int8", action="store_true", help="int8 post-training quantization calibrated on "
                           "--data (ONNX, OpenVINO, LiteRT)")
    parser.add_argument("--data", default=None, help="dataset folder or YAML (its train images), or an image "
                        "folder, for int8 calibration")
    parser.add_argument("--calibration-images", type=int, default=DEFAULT_CALIBRATION_IMAGES,
                        help=f"images used for int8 calibration (default: {DEFAULT_CALIBRATION_IMAGES}, "
                        "or all if fewer)")
    parser.add_argument("--nms", action="store_true", help="build NMS into the graph: outputs the final "
                        "[B, max-det, 6] detections (ONNX, OpenVINO)")
    parser.add_argument("--conf", type=float, default=0.25, help="score threshold of --nms (default: 0.25)")
    parser.add_argument("--iou", type=float, default=0.45, help="IoU threshold of --nms (default: 0.45)")
    parser.add_argument("--max-det", type=int, default=300, help="detections per image of --nms (default: 300)")
    parser.add_argument("--multi-label", action="store_true", help="--nms keeps a box once per class above "
                        "--conf (as val does), not only its best class")


def run_export(args: argparse.Namespace) -> int:
    """Run ``yolotrain export``; prints each written path, or a one-line error to stderr and returns 1."""
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    try:
        if not formats:
            raise ValueError("--format is empty")
        if len(formats) > 1 and args.output is not None:
            raise ValueError("--output names one file: leave it out when exporting several formats")
        for fmt in formats:  # every format checked before the first one is written
            _check_options(fmt, args.half, args.int8, args.raw, args.nms, args.data)
        for fmt in formats:
            path = export(args.weights, fmt, out=args.output, img_size=args.img_size,
                          dynamic_batch=not args.static_batch, dynamic_size=args.dynamic_size,
                          simplify=not args.no_simplify, raw=args.raw, opset=args.opset, half=args.half,
                          int8=args.int8, data=args.data, calibration_images=args.calibration_images,
                          nms=args.nms, conf=args.conf, iou=args.iou, max_det=args.max_det,
                          multi_label=args.multi_label)
            print(path)
    except (CheckpointError, ValueError, ImportError, OSError) as exc:
        print(f"yolotrain export: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
              file=sys.stderr)
        return 1
    return 0
