"""Export a detector to ONNX or TorchScript (``yolotrain export``).

The exported graph is the fused model (BatchNorm folded into the convolutions) returning either the
decoded ``[B, N, 5+nc]`` output (cx, cy, w, h in input pixels, sigmoid objectness and class scores;
no NMS) or, with ``raw=True``, the raw head maps (one per level). ONNX files carry the class names, strides,
anchors, image size and class count in ``metadata_props``; TorchScript files in ``config.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint import CheckpointError
from ..model import Yolov5
from .pretrained import load_model

FORMATS: dict[str, str] = {"onnx": ".onnx", "torchscript": ".torchscript"}
DEFAULT_OPSET = 17
DECODED_OUTPUT = "output0"
EXPORT_PACKAGES_HINT = "pip install 'yolotrain[export]'"


class _ExportGraph(nn.Module):
    """What gets traced: images → decoded output, or → the raw maps as a tuple."""

    def __init__(self, model: Yolov5, raw: bool) -> None:
        super().__init__()
        self.model = model
        self.raw = raw

    def forward(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        maps = self.model.forward_maps(images)
        return tuple(maps) if self.raw else self.model.head.decode(maps)


def raw_output_names(model: Yolov5) -> tuple[str, ...]:
    """Names of the raw head maps: ``p3``, ``p4``, ``p5`` (and ``p6`` on P6 models), by level stride."""
    return tuple(f"p{int(s).bit_length() - 1}" for s in model.head.stride.tolist())


def _image_size(img_size: int | Sequence[int], stride: int = 32) -> tuple[int, int]:
    size = (int(img_size), int(img_size)) if isinstance(img_size, int) else tuple(int(s) for s in img_size)
    if len(size) == 1:
        size = (size[0], size[0])
    if len(size) != 2 or any(s <= 0 or s % stride for s in size):
        raise ValueError(f"img_size must be one or two positive multiples of {stride}, got {img_size!r}")
    return size


def export_metadata(model: Yolov5, size: tuple[int, int], raw: bool, dynamic_batch: bool,
                    dynamic_size: bool) -> dict[str, str]:
    """String metadata stored with an export (read back by :class:`~yolotrain.interop.OnnxModel`)."""
    head = model.head
    anchors = (head.anchors * head.stride.view(-1, 1, 1)).tolist()
    names = list(getattr(model, "names", None) or [str(i) for i in range(head.nc)])
    return {
        "producer": "yolotrain", "model": f"yolov5{model.version}", "nc": str(head.nc), "names": json.dumps(names),
        "stride": json.dumps([int(s) for s in head.stride.tolist()]), "anchors": json.dumps(anchors),
        "img_size": json.dumps(list(size)), "raw": json.dumps(raw), "dynamic_batch": json.dumps(dynamic_batch),
        "dynamic_size": json.dumps(dynamic_size),
    }


def _prepare(weights_or_model: str | Path | Yolov5, fmt: str, out: str | Path | None) -> tuple[Yolov5, Path]:
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if isinstance(weights_or_model, nn.Module):
        if out is None:
            raise ValueError("out= is required when exporting a model object")
        # A copy: fusing replaces the BatchNorms, which must not happen to the caller's (maybe training) model.
        model = copy.deepcopy(weights_or_model)
    else:
        model = load_model(weights_or_model)
        out = out if out is not None else _default_output(Path(weights_or_model), fmt)
    return model.float().cpu().fuse(), Path(out)


def _default_output(weights: Path, fmt: str) -> Path:
    name = weights.name.removesuffix(".json").removesuffix(".safetensors").removesuffix(".pt")
    return weights.with_name(name + FORMATS[fmt])


def export(weights_or_model: str | Path | Yolov5, fmt: str = "onnx", out: str | Path | None = None,
           img_size: int | Sequence[int] | None = None, dynamic_batch: bool = True, dynamic_size: bool = False,
           simplify: bool = True, raw: bool = False, opset: int = DEFAULT_OPSET) -> Path:
    """Export a checkpoint path or a :class:`Yolov5` to ``fmt`` (``'onnx'`` or ``'torchscript'``).

    ``out`` defaults to the weights path with the format's suffix. ONNX exports use opset
    ``opset`` (17 or later), a dynamic batch axis unless ``dynamic_batch=False``, dynamic height
    and width with ``dynamic_size=True``, and are simplified with onnxslim unless
    ``simplify=False``. TorchScript graphs are traced at ``img_size`` (their batch size and image
    size stay free as far as the traced operations allow). ``img_size`` defaults to the model's
    training size (640; 1280 for P6 models). Returns the written path.
    """
    model, out = _prepare(weights_or_model, fmt, out)
    size = _image_size(model.default_img_size if img_size is None else img_size, model.max_stride)
    if opset < DEFAULT_OPSET:
        raise ValueError(f"opset must be {DEFAULT_OPSET} or later, got {opset}")
    graph = _ExportGraph(model, raw).eval()
    example = torch.zeros(1, model.in_channels, *size)
    metadata = export_metadata(model, size, raw, dynamic_batch, dynamic_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # The input-shape checks in forward_maps are Python conditions the tracer reports as constants.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        if fmt == "onnx":
            _export_onnx(graph, example, out, metadata, dynamic_batch, dynamic_size, simplify, opset)
        else:
            _export_torchscript(graph, example, out, metadata)
    return out


def _dynamic_axes(raw: tuple[str, ...] | None, dynamic_batch: bool,
                  dynamic_size: bool) -> dict[str, dict[int, str]]:
    batch = {0: "batch"} if dynamic_batch else {}
    axes = {"images": batch | ({2: "height", 3: "width"} if dynamic_size else {})}
    if raw:
        axes.update({name: batch | ({2: f"grid_height{level}", 3: f"grid_width{level}"} if dynamic_size else {})
                     for level, name in enumerate(raw)})
    else:
        axes.update({DECODED_OUTPUT: batch | ({1: "predictions"} if dynamic_size else {})})
    return {name: value for name, value in axes.items() if value}


def _export_onnx(graph: _ExportGraph, example: torch.Tensor, out: Path, metadata: dict[str, str],
                 dynamic_batch: bool, dynamic_size: bool, simplify: bool, opset: int) -> None:
    try:
        import onnx
    except ImportError:
        raise ImportError(f"ONNX export needs the 'onnx' package ({EXPORT_PACKAGES_HINT})") from None
    raw_names = raw_output_names(graph.model) if graph.raw else None
    outputs = list(raw_names) if raw_names else [DECODED_OUTPUT]
    handle, traced_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".onnx")
    os.close(handle)
    traced = Path(traced_name)
    try:
        with warnings.catch_warnings():
            # The TorchScript-based exporter: the dynamo one needs onnxscript, which is not a
            # dependency, so its deprecation notices are expected here.
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(graph, (example,), str(traced), dynamo=False, opset_version=opset,
                              input_names=["images"], output_names=outputs, do_constant_folding=True,
                              dynamic_axes=_dynamic_axes(raw_names, dynamic_batch, dynamic_size))
        proto = onnx.load(str(traced))
    finally:
        traced.unlink(missing_ok=True)
    if simplify:
        proto = _simplify(proto)
    for key, value in metadata.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(proto)
    onnx.save(proto, str(out))


def _simplify(proto: Any) -> Any:
    try:
        import onnxslim
    except ImportError:
        raise ImportError(f"simplifying the ONNX graph needs 'onnxslim' ({EXPORT_PACKAGES_HINT}), "
                          "or pass simplify=False / --no-simplify") from None
    return onnxslim.slim(proto)


def _export_torchscript(graph: _ExportGraph, example: torch.Tensor, out: Path, metadata: dict[str, str]) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        # TorchScript is deprecated upstream but still what C++/mobile deployments load; the user asked for it.
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        traced = torch.jit.trace(graph, example, strict=False, check_trace=False)
        torch.jit.save(traced, str(out), _extra_files={"config.json": json.dumps(metadata)})


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``yolotrain export``."""
    parser.add_argument("--weights", required=True, help="checkpoint: ours (.safetensors/.json), a state dict, "
                        "or an official YOLOv5 .pt")
    parser.add_argument("--format", choices=sorted(FORMATS), default="onnx", help="export format (default: onnx)")
    parser.add_argument("--output", default=None, help="output file (default: the weights path with the "
                        "format's suffix)")
    parser.add_argument("--img-size", type=int, nargs="+", default=None, metavar="N",
                        help="example image size: one side or height width, multiples of the largest stride "
                        "(default: 640; 1280 for P6 models)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset (default: {DEFAULT_OPSET})")
    parser.add_argument("--static-batch", action="store_true", help="fix the batch size to 1 (ONNX)")
    parser.add_argument("--dynamic-size", action="store_true", help="dynamic image height and width (ONNX)")
    parser.add_argument("--no-simplify", action="store_true", help="skip onnxslim graph simplification")
    parser.add_argument("--raw", action="store_true", help="output the raw head maps (one per level) instead of "
                        "decoded boxes")


def run_export(args: argparse.Namespace) -> int:
    """Run ``yolotrain export``; prints the written path, or a one-line error to stderr and returns 1."""
    try:
        path = export(args.weights, args.format, out=args.output, img_size=args.img_size,
                      dynamic_batch=not args.static_batch, dynamic_size=args.dynamic_size,
                      simplify=not args.no_simplify, raw=args.raw, opset=args.opset)
    except (CheckpointError, ValueError, ImportError, OSError) as exc:
        print(f"yolotrain export: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
