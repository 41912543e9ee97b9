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
convolutions (see :mod:`yolotrain.interop.exporting.calibration` and docs/int8.md).

Files are written under a temporary name in the destination folder and renamed at the end, so a
failed export leaves nothing behind.

Each format is a module of :mod:`yolotrain.interop.formats` declaring what it can do and how it is
written; this module checks a request against those capabilities, builds the graph and metadata,
and hands them to the format's writer. The options are declared once in :class:`ExportConfig`, from
which the ``export`` command line is generated.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...boxes import MAX_IMG_SIZE
from ...checkpoint import CheckpointError
from ...family import family_of, nms_iou
from ...model import Yolov5
from ...model.classify import Classifier
from ...nms import NMSConfig, check_nms_limits
from ...outputs import dataset_inputs, refuse_overwriting_inputs, refuse_replacing_others
from ...progress import progress_bar
from ...settings import add_arguments, from_mapping, setting
from ...task import task_names, task_of
from ..formats import REGISTRY, ConversionError, ExportFormat, ExportJob, export_metadata_of
from ..loading.resolve import WEIGHTS_FLAGS, resolve_trainable, weights_inputs
from .calibration import DEFAULT_CALIBRATION_IMAGES, CalibrationImages, calibration_files
from .graph import BOXES, ExportGraph, raw_output_names

# Name → file suffix, and what each format can do beyond plain float32, read from the formats' modules.
FORMATS: dict[str, str] = {name: spec.suffix for name, spec in REGISTRY.items()}
HALF_FORMATS = frozenset(name for name, spec in REGISTRY.items() if spec.half)
INT8_FORMATS = frozenset(name for name, spec in REGISTRY.items() if spec.int8)
NMS_FORMATS = frozenset(name for name, spec in REGISTRY.items() if spec.nms)
MOBILE_FORMATS = frozenset(name for name, spec in REGISTRY.items() if spec.mobile)
KERAS_FORMATS = frozenset(name for name, spec in REGISTRY.items() if spec.keras)
# Formats whose graphs keep a free batch axis and image size (the others are fixed at img_size, batch 1).
DYNAMIC_FORMATS = frozenset(name for name, spec in REGISTRY.items() if spec.dynamic)
DEFAULT_OPSET = 17
# What export raises with a message that already says what to do: the command prints its first line.
ONE_LINE_ERRORS = (CheckpointError, ConversionError, ValueError, ImportError, OSError)
# The newest opset PyTorch's TorchScript-based ONNX exporter (the one used: the dynamo one needs onnxscript) writes;
# beyond it the exporter fails deep inside, printing its whole graph.
MAX_OPSET = getattr(torch.onnx._constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", 20)

__all__ = ["DYNAMIC_FORMATS", "FORMATS", "ExportConfig", "add_export_arguments", "default_output", "export",
           "export_metadata", "interop_metadata", "raw_output_names", "run_export"]


@dataclass(frozen=True)
class ExportConfig:
    """The settings of one ``yolotrain export`` run; the command line is generated from them."""

    weights: str | None = setting(None, "checkpoint: ours (.safetensors/.json), a state dict, or an official YOLOv5 "
                                  "or Ultralytics .pt (required)", flags=WEIGHTS_FLAGS)
    format: tuple[str, ...] = setting(("onnx",), f"export formats, space or comma separated: {', '.join(FORMATS)}; "
                                      "edgetpu: the int8 LiteRT model Google's Edge TPU compiler reads",
                                      flags=("--format", "--include"))
    output: str | None = setting(None, "output file (default: the weights path with the format's suffix; one "
                                 "format only)")
    img_size: tuple[int, ...] | None = setting(None, "example image size: one side or height width, multiples of "
                                               "the largest stride (default: 640; 1280 for P6 models)",
                                               flags=("--img-size", "--imgsz", "--img"))
    opset: int = setting(DEFAULT_OPSET, f"ONNX opset ({DEFAULT_OPSET} to {MAX_OPSET})")
    dynamic_batch: bool = setting(True, "a free batch axis (ONNX, OpenVINO, TensorRT); --static-batch fixes it to 1",
                                  off_flags=("--static-batch",))
    dynamic_size: bool = setting(False, "dynamic image height and width (ONNX, OpenVINO, TensorRT)",
                                 flags=("--dynamic-size", "--dynamic"))
    simplify: bool = setting(True, "simplify the ONNX graph with onnxslim")
    raw: bool = setting(False, "output the raw head maps (one per level) instead of decoded boxes (ONNX, "
                        "TorchScript)")
    half: bool = setting(False, f"fp16 weights ({', '.join(sorted(HALF_FORMATS))})")
    int8: bool = setting(False, f"int8 post-training quantization calibrated on --data "
                         f"({', '.join(sorted(INT8_FORMATS))})")
    data: str | None = setting(None, "dataset folder or YAML (its train images), or an image folder, for int8 "
                               "calibration")
    calibration_images: int = setting(DEFAULT_CALIBRATION_IMAGES, "images used for int8 calibration (all if fewer)")
    nms: bool = setting(False, "build NMS into the graph: outputs the final [B, max-det, 6] detections "
                        f"({', '.join(sorted(NMS_FORMATS))})")
    conf: float = setting(NMSConfig.conf, "score threshold of --nms", flags=("--conf", "--conf-thres"))
    iou: float | None = setting(NMSConfig.iou, "IoU threshold of --nms (default: the model family's for prediction: "
                                "0.45 for YOLOv5, 0.7 for anchor-free models)", flags=("--iou", "--iou-thres"))
    max_det: int = setting(300, "detections per image of --nms", flags=("--max-det", "--topk-all"))
    multi_label: bool = setting(False, "--nms keeps a box once per class above --conf (as val does), not only "
                                "its best class")
    optimize: bool = setting(False, "for PyTorch Mobile's lite interpreter: a frozen graph (weights folded in as "
                             "constants; XNNPACK's mobile rewrites where the PyTorch build has XNNPACK) saved with "
                             f"its bytecode ({', '.join(sorted(MOBILE_FORMATS))})")
    keras: bool = setting(False, "write the SavedModel with Keras: it also loads as a Keras model "
                          f"(tf_keras.models.load_model) ({', '.join(sorted(KERAS_FORMATS))})")
    force: bool = setting(False, "replace an existing output that is not an earlier export of this format (never "
                          "one of the export's inputs)")


_DEFAULTS = ExportConfig()

# Options of the reference's export.py accepted without an effect here, and why that keeps their meaning.
NO_EFFECT_REFERENCE_OPTIONS = {
    "--device": "exports are traced on the CPU, which writes the same file; TensorRT engines are built on the "
                "current CUDA device",
    "--inplace": "the exported decode computes the same values with or without in-place operations",
}
# Options of the reference's export.py for what yolotrain's exports do not have: each stops the run in one
# line rather than being ignored. docs/coming-from-yolov5.md lists them with the other differences.
UNSUPPORTED_EXPORT_OPTIONS = {
    "--batch-size": "the batch axis is free (ONNX, OpenVINO, TensorRT) or 1; --static-batch fixes it to 1",
    "--verbose": "TensorRT's build log is not shown",
    "--workspace": "the TensorRT builder's workspace is fixed at 4 GB, the reference's default",
    "--agnostic-nms": "the built-in NMS is per class",
    "--topk-per-class": "the built-in NMS keeps at most --max-det boxes per image, not a count per class",
}


# Formats of the reference's export.py made by a tool that cannot be installed beside ours: each is one line saying
# how to make it from one of our exports. `yolotrain export --format edgetpu` writes that export (the int8 LiteRT
# model the Edge TPU compiler reads) and then says the line.
FINISHED_ELSEWHERE = {
    "edgetpu": "Edge TPU models are compiled by Google's edgetpu_compiler (Linux x86-64, not on PyPI: "
               "https://coral.ai/docs/edgetpu/compiler/) from an int8 LiteRT model, which `yolotrain export "
               "--format edgetpu --data DATA` writes (as --format tflite --int8) before saying how to compile it",
}
# The export `--format edgetpu` writes: the format and the options it implies.
EDGE_TPU_SOURCE = ("tflite", {"int8": True})


def _image_size(img_size: int | Sequence[int], stride: int = 32) -> tuple[int, int]:
    size = (int(img_size), int(img_size)) if isinstance(img_size, int) else tuple(int(s) for s in img_size)
    if len(size) == 1:
        size = (size[0], size[0])
    if len(size) != 2 or any(s <= 0 or s % stride for s in size):
        raise ValueError(f"img_size must be one or two positive multiples of {stride}, got {img_size!r}")
    if max(size) > MAX_IMG_SIZE:
        raise ValueError(f"img_size must be at most {MAX_IMG_SIZE}, got {img_size!r}")
    return size


def interop_metadata(model: Yolov5 | Classifier, size: tuple[int, int], dynamic_batch: bool, dynamic_size: bool,
                     precision: str = "fp32", nms: dict | None = None) -> dict[str, Any]:
    """The fields other tools read from an export, as values: the reference's ``DetectMultiBackend`` reads
    ``stride`` (the multiple input sides round to, a detector's largest stride) and ``names`` (``{index:
    name}``); ultralytics' ``AutoBackend`` those and ``task``, ``imgsz`` ([height, width]), ``batch`` (the
    traced batch) and ``args`` (its export options: ``dynamic`` when batch and size are both free, ``nms``
    when NMS is inside, the precision as ``half``/``int8``).

    Formats whose metadata is a string map store them as :func:`export_metadata` writes them; the others
    (OpenVINO's YAML beside the IR, TorchScript's ``config.txt``, LiteRT's archive) store these values as
    the tools write them there.
    """
    task = task_of(model)
    names = list(getattr(model, "names", None) or [str(i) for i in range(task.checkpoint_num_classes(model))])
    return {"stride": int(model.size_multiple), "names": dict(enumerate(names)), "task": task.name,
            "imgsz": list(size), "batch": 1,
            "args": {"imgsz": list(size), "batch": 1, "dynamic": dynamic_batch and dynamic_size,
                     "half": precision == "fp16", "int8": precision == "int8", "nms": nms is not None}}


def export_metadata(model: Yolov5 | Classifier, size: tuple[int, int], raw: bool, dynamic_batch: bool,
                    dynamic_size: bool, precision: str = "fp32", nms: dict | None = None) -> dict[str, str]:
    """String metadata stored with an export (read back by :class:`~yolotrain.interop.runtime.ExportedModel`):
    the model's task's own fields (:meth:`yolotrain.task.Task.export_metadata`), then those of every export.

    The fields of :func:`interop_metadata` are written as the reference's ``export.py`` writes them (whole
    numbers as text, the rest as Python literals: ``names`` a ``{index: name}`` dict), so that its
    ``DetectMultiBackend`` and ultralytics' ``AutoBackend`` read our files; ours are ``class_names`` (a JSON
    list), ``img_size`` and, from a box model's task, ``strides``.
    """
    task = task_of(model)
    interop = interop_metadata(model, size, dynamic_batch, dynamic_size, precision, nms)
    metadata = {"producer": "yolotrain", **task.export_metadata(model)}
    metadata.update({key: value if isinstance(value, str) else repr(value) for key, value in interop.items()})
    metadata.update({
        "class_names": json.dumps(list(interop["names"].values())),
        # Raw head maps are the boxes' maps before decoding: an export without boxes has none.
        "img_size": json.dumps(list(size)), "raw": json.dumps(raw and BOXES in task.export_outputs),
        "dynamic_batch": json.dumps(dynamic_batch), "dynamic_size": json.dumps(dynamic_size), "precision": precision,
    })
    if nms is not None:
        metadata["nms"] = json.dumps(nms)
    return metadata


def _check_task(model: Yolov5 | Classifier, fmt: str, half: bool, int8: bool, raw: bool, nms: bool) -> None:
    """One-line errors for what the model's task cannot be exported as: a format that lacks one of its
    output kinds or that the task does not export to, then the options its exports cannot have."""
    task = task_of(model)
    supported = sorted(name for name, spec in REGISTRY.items() if spec.carries(task.export_outputs)
                       and (task.export_formats is None or name in task.export_formats))
    if fmt not in supported:
        raise ValueError(task.export_format_refusal(fmt, supported))
    task.check_export_options(half, int8, raw, nms)
    refusal = family_of(model).raw_export_refusal() if raw else None
    if refusal:
        raise ValueError(refusal)


def _load(weights_or_model: str | Path | Yolov5 | Classifier) -> Yolov5 | Classifier:
    if isinstance(weights_or_model, nn.Module) and getattr(weights_or_model, "task", None) not in task_names():
        raise ValueError(f"only models of yolotrain's tasks ({', '.join(sorted(task_names()))}) can be exported, "
                         f"got a {type(weights_or_model).__name__}")
    model = resolve_trainable(weights_or_model)
    if model is weights_or_model:
        # A copy: fusing replaces the BatchNorms, which must not happen to the caller's (maybe training) model.
        model = copy.deepcopy(model)
    return model.float().cpu().eval().fuse()


def default_output(weights: str | Path, fmt: str, half: bool = False, int8: bool = False) -> Path:
    """The weights path with the format's suffix, ``_fp16``/``_int8`` marking a reduced precision."""
    weights = Path(weights)
    name = weights.name.removesuffix(".json").removesuffix(".safetensors").removesuffix(".pt")
    return weights.with_name(name + ("_fp16" if half else "_int8" if int8 else "") + REGISTRY[fmt].suffix)


def is_export_of(path: Path, spec: ExportFormat) -> bool:
    """Whether ``path`` is an export of ``spec``'s format written by :func:`export` (by the metadata it
    carries, read as data); its companion files (OpenVINO's ``.bin``) belong to it."""
    return export_metadata_of(path, spec) is not None


def _check_options(fmt: str, data: object, *, half: bool = False, int8: bool = False, raw: bool = False,
                   nms: bool = False, optimize: bool = False, keras: bool = False) -> None:
    """One-line errors for requests no format-specific code should see."""
    if fmt in FINISHED_ELSEWHERE:
        raise ValueError(FINISHED_ELSEWHERE[fmt])
    if fmt not in REGISTRY:
        raise ValueError(f"unknown export format {fmt!r}: choose one of {', '.join(REGISTRY)}")
    if half and int8:
        raise ValueError("choose one of half and int8")
    for asked, capability, what in ((half, "half", "fp16 (--half)"), (int8, "int8", "int8 (--int8)"),
                                    (nms, "nms", "NMS inside (--nms)"), (raw, "raw", "raw outputs (--raw)"),
                                    (optimize, "mobile", "mobile optimization (--optimize)"),
                                    (keras, "keras", "a Keras SavedModel (--keras)")):
        if asked and not getattr(REGISTRY[fmt], capability):
            supported = sorted(name for name, spec in REGISTRY.items() if getattr(spec, capability))
            raise ValueError(f"{what} export is available for {', '.join(supported)}, not {fmt}")
    if raw and nms:
        raise ValueError("raw outputs and NMS inside exclude each other")
    if int8 and data is None:
        raise ValueError("int8 export needs calibration images: pass data= (--data DATASET)")
    unavailable = REGISTRY[fmt].unavailable
    reason = unavailable() if unavailable is not None else None
    if reason is not None:
        raise ImportError(reason)


def export(weights_or_model: str | Path | Yolov5, fmt: str = "onnx", out: str | Path | None = None,
           img_size: int | Sequence[int] | None = _DEFAULTS.img_size, dynamic_batch: bool = _DEFAULTS.dynamic_batch,
           dynamic_size: bool = _DEFAULTS.dynamic_size, simplify: bool = _DEFAULTS.simplify, raw: bool = _DEFAULTS.raw,
           opset: int = _DEFAULTS.opset, half: bool = _DEFAULTS.half, int8: bool = _DEFAULTS.int8,
           data: str | os.PathLike | None = _DEFAULTS.data, calibration_images: int = _DEFAULTS.calibration_images,
           nms: bool = _DEFAULTS.nms, conf: float = _DEFAULTS.conf, iou: float | None = _DEFAULTS.iou,
           max_det: int = _DEFAULTS.max_det, multi_label: bool = _DEFAULTS.multi_label,
           optimize: bool = _DEFAULTS.optimize, keras: bool = _DEFAULTS.keras, force: bool = _DEFAULTS.force) -> Path:
    """Export a checkpoint path or a :class:`Yolov5` to ``fmt`` (one of :data:`FORMATS`); the options are those of
    :class:`ExportConfig`.

    ``out`` defaults to the weights path with the format's suffix (see :func:`default_output`).
    ONNX and OpenVINO graphs keep a dynamic batch axis unless ``dynamic_batch=False`` and dynamic
    height and width with ``dynamic_size=True``; LiteRT and Core ML graphs are fixed at batch 1 and
    ``img_size``. ONNX exports use opset ``opset`` (17 to :data:`MAX_OPSET`, 20 with this PyTorch) and are
    simplified with onnxslim unless ``simplify=False``. ``half`` / ``int8`` choose the precision (``int8``
    calibrates on up to ``calibration_images`` images from the dataset or image folder ``data``); ``nms=True`` builds
    non-maximum suppression with ``conf``, ``iou``, ``max_det`` and ``multi_label`` into the graph;
    ``optimize=True`` writes TorchScript for PyTorch Mobile's lite interpreter, ``keras=True`` a SavedModel that
    Keras loads.
    ``img_size`` defaults to the model's training size (640; 1280 for P6 models). Returns the written path.

    An existing ``out`` is replaced only when it is an earlier export of this format (it carries our
    metadata), or with ``force``; an input (the weights, the calibration data) never is. A converter that fails
    raises :class:`~yolotrain.interop.formats.ConversionError` in one line: one run as a process of its own names
    itself and the last line it printed, one inside this process the format and its error (chained as the cause).
    """
    _check_options(fmt, data, half=half, int8=int8, raw=raw, nms=nms, optimize=optimize, keras=keras)
    if not DEFAULT_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset must be {DEFAULT_OPSET} to {MAX_OPSET} (the newest PyTorch's ONNX exporter writes), "
                         f"got {opset}")
    if not (0.0 <= conf <= 1.0 and (iou is None or 0.0 <= iou <= 1.0)):
        raise ValueError(f"NMS settings out of range: conf {conf} and iou {iou} in [0, 1]")
    check_nms_limits(max_det)
    if out is None and isinstance(weights_or_model, nn.Module):
        raise ValueError("out= is required when exporting a model object")
    out = Path(out) if out is not None else default_output(weights_or_model, fmt, half, int8)
    spec = REGISTRY[fmt]
    if spec.exact_suffix and not out.name.endswith(spec.suffix):
        raise ValueError(f"{fmt} output must end in {spec.suffix}, got {out.name}")
    model = _load(weights_or_model)
    _check_task(model, fmt, half, int8, raw, nms)
    iou = nms_iou(iou, model, "predict")
    size = _image_size(model.default_img_size if img_size is None else img_size, model.size_multiple)
    calibration_set = calibration_files(data, calibration_images) if int8 else []
    calibration = CalibrationImages(calibration_set, size) if int8 else None
    nms_settings = {"conf": conf, "iou": iou, "max_det": max_det, "multi_label": multi_label} if nms else None
    graph = ExportGraph(model, raw, nms_settings).eval()
    if not spec.dynamic:
        dynamic_batch = dynamic_size = False
    precision = "fp16" if half else "int8" if int8 else "fp32"
    metadata = export_metadata(model, size, raw, dynamic_batch, dynamic_size, precision, nms_settings)
    interop = interop_metadata(model, size, dynamic_batch, dynamic_size, precision, nms_settings)
    written = [("--output", out)] + [("--output", out.with_suffix(suffix)) for suffix in spec.companions]
    weights = [] if isinstance(weights_or_model, nn.Module) else weights_inputs(weights_or_model)
    refuse_overwriting_inputs(written, weights + dataset_inputs(calibration_set, data if int8 else None))
    if not force:
        refuse_replacing_others(written, lambda _: is_export_of(out, spec), f"an export to {spec.title} written by "
                                "yolotrain export", "--force")
    out.parent.mkdir(parents=True, exist_ok=True)
    job = ExportJob(graph=graph, example=torch.zeros(1, model.in_channels, *size), out=out, metadata=metadata,
                    interop_metadata=interop,
                    half=half, calibration=calibration, size=size, min_side=model.size_multiple,
                    dynamic_batch=dynamic_batch, dynamic_size=dynamic_size, simplify=simplify, opset=opset,
                    optimize=optimize, keras=keras)
    with warnings.catch_warnings():
        # The input-shape checks in forward_maps are Python conditions the tracer reports as constants.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        try:
            spec.write(job)
        except ONE_LINE_ERRORS:
            raise
        except Exception as error:  # a converter failing inside this process (PyTorch's ONNX exporter, Core ML ...)
            detail = _first_line(error)
            raise ConversionError(f"{spec.title} conversion failed: {type(error).__name__}"
                                  + (f": {detail}" if detail else "")) from error
    return out


class _ReferenceOption(argparse.Action):
    """Records a reference option that has no effect here or is not supported (with or without its value)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        if option_string in UNSUPPORTED_EXPORT_OPTIONS:
            namespace.unsupported = [*getattr(namespace, "unsupported", []), option_string]


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``yolotrain export``: one per :class:`ExportConfig` setting, and the reference's options
    that have no effect or are refused (hidden from ``--help``; docs/coming-from-yolov5.md lists them)."""
    for flag in (*NO_EFFECT_REFERENCE_OPTIONS, *UNSUPPORTED_EXPORT_OPTIONS):
        parser.add_argument(flag, nargs="?", action=_ReferenceOption, default=argparse.SUPPRESS,
                            help=argparse.SUPPRESS)
    add_arguments(parser, ExportConfig)
    for action in parser._actions:
        if action.dest == "weights":
            action.required = True
        elif action.dest == "format":
            action.metavar = "FORMAT"


def export_config(args: argparse.Namespace) -> ExportConfig:
    """The settings of parsed ``export`` options; a refused reference option is a ``ValueError`` saying why."""
    unsupported = getattr(args, "unsupported", [])
    if unsupported:
        raise ValueError(f"{unsupported[0]} is not supported: {UNSUPPORTED_EXPORT_OPTIONS[unsupported[0]]}")
    names = {f.name for f in dataclasses.fields(ExportConfig)}
    return from_mapping(ExportConfig, {k: v for k, v in vars(args).items() if k in names})


def run_export(args: argparse.Namespace) -> int:
    """Run ``yolotrain export``; prints each written path, or a one-line error to stderr and returns 1."""
    try:
        config = export_config(args)
        formats = [f for f in config.format if f]
        if not formats:
            raise ValueError("--format is empty")
        if len(formats) > 1 and config.output is not None:
            raise ValueError("--output names one file: leave it out when exporting several formats")
        options = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                   if f.name not in ("weights", "format", "output")}
        if config.img_size is not None:  # a list, as given on the command line (and so named in errors)
            options["img_size"] = list(config.img_size)
        # What each requested format writes: itself, or for edgetpu the int8 LiteRT model the compiler reads.
        jobs = [(fmt, *EDGE_TPU_SOURCE) if fmt == "edgetpu" else (fmt, fmt, {}) for fmt in formats]
        for _, written, implied in jobs:  # every format checked before the first one is written
            checked = {name: options[name] for name in ("half", "int8", "raw", "nms", "optimize", "keras")}
            _check_options(written, config.data, **{**checked, **implied})
        with progress_bar(jobs, desc="export", unit="format") as bar:
            for requested, written, implied in bar:
                bar.set_postfix_str(requested)
                path = export(config.weights, written, out=config.output, **{**options, **implied})
                bar.write(str(path), file=sys.stdout)
                if requested == "edgetpu":
                    bar.write(f"Edge TPU: compile it with `edgetpu_compiler -s {path}` where Google's compiler is "
                              "installed (Linux x86-64, not on PyPI: https://coral.ai/docs/edgetpu/compiler/); the "
                              "Edge TPU runs its int8 operations, the float decode tail stays on the CPU",
                              file=sys.stderr)
    except ONE_LINE_ERRORS as exc:
        print(f"yolotrain export: error: {_first_line(exc) or type(exc).__name__}", file=sys.stderr)
        return 1
    return 0


def _first_line(error: BaseException) -> str:
    """The first line of ``error``'s message ("" for none)."""
    return next(iter(str(error).strip().splitlines()), "")
