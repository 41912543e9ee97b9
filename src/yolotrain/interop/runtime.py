"""Exported detectors run through their own runtimes behind the call shape of :class:`Yolov5`.

Every export written by :func:`~yolotrain.interop.exporting.exporter.export` carries the same string metadata
(class names, strides, anchors, image size, precision, and for ``--nms`` exports the built-in NMS
settings). :class:`ExportedModel` reads it and does the format-independent part: input-shape checks,
running fixed-batch models one image at a time, decoding raw head maps, and applying a built-in
NMS's settings. Each runtime (onnxruntime, OpenVINO, LiteRT, TensorRT, TorchScript) only supplies
:meth:`ExportedModel._run`.
"""

from __future__ import annotations

import abc
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoint import MAX_CLASSES, CheckpointError
from ..detector import Task
from ..family import DEFAULT_FAMILY, family_names
from ..messages import brief, shorten
from ..model import Detect
from ..task import get_task, task_names, task_of
from .exporting.graph import BOXES, MASK_PROTOTYPES


class ExportedModel(abc.ABC):
    """Base of the runtime backends: metadata, shape checks and decoding shared by every format.

    A :class:`~yolotrain.detector.Detector`: ``model(imgs)`` takes ``[B, 3, H, W]`` float images and returns
    on the images' device what the PyTorch model of its ``task`` returns in ``eval()`` mode (the export's
    outputs, one per output kind of the task). ``names``, ``num_classes``, ``size_multiple``, ``img_size``
    and ``precision`` come from the file's metadata. The export of a model that predicts boxes (detection,
    segmentation) is also a :class:`~yolotrain.detector.BoxDetector`: its ``stride``, ``max_stride`` and
    ``end_to_end`` come from the metadata too, and one with NMS inside answers :meth:`detections`; an
    export without boxes (a classifier's) has none of these three.
    """

    format_name = "exported"
    task: Task = "detect"
    # Inputs are fed from the CPU as float32 whatever the precision inside (each runtime converts).
    device = torch.device("cpu")
    dtype = torch.float32

    def __init__(self, path: str | os.PathLike, metadata: Mapping[str, str],
                 input_shape: Sequence[int | None],
                 output_shapes: Sequence[Sequence[int | str | None]] | None = None) -> None:
        self.path = Path(path)
        if metadata.get("producer") != "yolotrain":
            raise CheckpointError(f"{self.path}: {self.format_name} file without yolotrain metadata "
                                  "(export it with yolotrain export)")
        fields = _read_metadata(metadata, self.path)
        self.num_classes: int = fields["nc"]
        self.names: list[str] = fields["names"]
        self.size_multiple: int = fields["size_multiple"]
        self.img_size: tuple[int, int] = tuple(fields["img_size"])
        self.raw: bool = fields["raw"]
        self.precision: str = fields["precision"]
        self.nms_settings: dict | None = fields["nms"]
        self.task: Task = fields["task"]
        self.num_masks: int = fields["nm"]
        # Keypoints (count, values each) after the class scores of a keypoint model's rows; None without them.
        self.kpt_shape: tuple[int, int] | None = fields["kpt_shape"]
        self.family: str = fields["family"]
        # Predictions per cell of each output level: YOLOv5's anchors, one for an anchor-free head.
        self.anchors_per_level = len(fields["anchors"][0]) if fields["anchors"] else int(bool(fields["strides"]))
        if fields["strides"]:  # the box protocol's fields, for the exports that predict boxes (BoxDetector) only
            self.stride = torch.tensor(fields["strides"], dtype=torch.float32)
            self.max_stride: int = max(fields["strides"])
            self.end_to_end: bool = self.nms_settings is not None  # NMS is part of the graph
        # Fixed axes are ints, free ones None (the runtimes name or mark them differently).
        self.input_shape = [s if isinstance(s, int) and s > 0 else None for s in input_shape]
        if None not in self.input_shape[2:4] and tuple(self.input_shape[2:4]) != self.img_size:
            raise CheckpointError(f"{self.path}: its yolotrain metadata disagrees with its graph: img_size "
                                  f"{list(self.img_size)}, the graph takes {shape_text(self.input_shape)} "
                                  "(was the metadata edited? export the model again)")
        if output_shapes is not None:  # what the metadata says against what the graph computes
            shapes = [[d if isinstance(d, int) and d > 0 else None for d in shape] for shape in output_shapes]
            self._check_outputs(shapes, self.input_shape[2:4], "its graph")
        # Raw exports leave decoding to the caller; Detect owns that maths, so reuse it (its 1-channel
        # convolutions are never run).
        self._decoder = Detect(self.num_classes, torch.tensor(fields["anchors"]), (1,) * len(fields["strides"]),
                               tuple(fields["strides"])) if self.raw else None

    def _check_outputs(self, shapes: Sequence[Sequence[int | None]], input_hw: Sequence[int | None],
                       source: str) -> None:
        """The outputs' shapes (None: not known) against the metadata; a mismatch is one line naming both."""
        found = self._output_mismatch(shapes, input_hw)
        if found:
            raise CheckpointError(f"{self.path}: its yolotrain metadata disagrees with {source}: {found} "
                                  "(was the metadata edited? export the model again)")

    def _output_mismatch(self, shapes: Sequence[Sequence[int | None]], input_hw: Sequence[int | None]) -> str | None:
        """What the metadata implies about the outputs that ``shapes`` contradicts (its task knows what its
        outputs look like), for an input of ``input_hw`` pixels; None when nothing does."""
        return task_of(self).exported_output_mismatch(self, shapes, input_hw)

    @property
    def dynamic_size(self) -> bool:
        return self.input_shape[2] is None or self.input_shape[3] is None

    @property
    def fixed_size(self) -> tuple[int, int] | None:
        return None if self.dynamic_size else self.img_size

    @property
    def default_img_size(self) -> int:
        return task_of(self).exported_default_img_size(self)

    @abc.abstractmethod
    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        """The runtime's outputs for a float32 NCHW batch whose shape the model accepts."""

    def _check(self, imgs: torch.Tensor) -> None:
        expected = self.input_shape
        if imgs.ndim != 4 or any(e is not None and e != s for e, s in zip(expected[1:], imgs.shape[1:])):
            shape = [e if e is not None else "?" for e in expected]
            raise ValueError(f"{self.path.name} expects images of shape {shape}, got {list(imgs.shape)}")

    def _forward(self, imgs: torch.Tensor) -> list[torch.Tensor]:
        self._check(imgs)
        batch = imgs.detach().to("cpu", torch.float32).numpy()
        if self.input_shape[0] is None or self.input_shape[0] == len(batch):
            outputs = [torch.from_numpy(np.ascontiguousarray(o)) for o in self._run_checked(batch)]
        elif self.input_shape[0] != 1:
            raise ValueError(f"{self.path.name} expects batches of {self.input_shape[0]}, got {len(batch)}")
        else:  # a batch-1 export: run the images one by one and stack the results
            per_image = [self._run_checked(batch[i:i + 1]) for i in range(len(batch))]
            outputs = [torch.from_numpy(np.concatenate(outs)) for outs in zip(*per_image)]
        self._check_outputs([list(o.shape) for o in outputs], list(imgs.shape[2:]), "what it computed")
        return outputs

    def _run_checked(self, images: np.ndarray) -> list[np.ndarray]:
        """:meth:`_run`, with whatever the runtime raises turned into one line naming the file."""
        try:
            return self._run(images)
        except Exception as exc:  # noqa: BLE001 - each runtime raises its own (often unexported) types
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(f"{self.path}: {self.format_name} runtime failed on a batch of shape "
                                  f"{list(images.shape)} ({shorten(first_line, 300)})") from None

    def __call__(self, imgs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Decoded ``[B, N, 5+nc]`` predictions for ``imgs`` ``[B, 3, H, W]`` (a segmentation model's with
        its prototype masks: ``(decoded, proto)``; a classifier's logits): the export's outputs, one per
        output kind of its task, raw head maps decoded."""
        if self.nms_settings is not None:
            raise ValueError(f"{self.path.name} has NMS inside: it returns detections, not raw predictions")
        outputs = self._forward(imgs)
        if self._decoder is not None:
            outputs = [self._decoder.decode(outputs)]
        outputs = [output.to(imgs.device) for output in outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def detections(self, imgs: torch.Tensor, conf: float, iou: float, max_det: int,
                   multi_label: bool = False, classes: Sequence[int] | None = None,
                   agnostic: bool = False) -> list[torch.Tensor]:
        """Per-image ``[n, 6]`` detections (xyxy, score, class) of an export with NMS inside.

        The built-in NMS ran with the settings given at export; asking for a stricter score threshold,
        fewer detections or a class subset filters its output exactly (a box below a score threshold
        never suppresses a box above it). Anything it cannot reproduce is a ``ValueError``.
        """
        built = self.nms_settings
        if built is None:
            raise ValueError(f"{self.path.name} has no NMS inside")
        if (conf < built["conf"] or iou != built["iou"] or max_det > built["max_det"]
                or multi_label != built["multi_label"] or agnostic):
            raise ValueError(
                f"{self.path.name} has NMS built in (conf {built['conf']}, iou {built['iou']}, max_det "
                f"{built['max_det']}, multi_label {built['multi_label']}); it cannot give conf {conf}, iou {iou}, "
                f"max_det {max_det}, multi_label {multi_label}{', agnostic' if agnostic else ''}: "
                "export again with those settings")
        (out,) = self._forward(imgs)
        class_filter = None if classes is None else torch.as_tensor(list(classes))
        kept = []
        for det in out.float():
            det = det[det[:, 4] > conf]
            if class_filter is not None:
                det = det[torch.isin(det[:, 5].long(), class_filter)]
            kept.append(det[:max_det].to(imgs.device))
        return kept

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self.path)!r}, nc={self.num_classes}, img_size={self.img_size}, "
                f"precision={self.precision!r}{', nms' if self.nms_settings is not None else ''})")


def shape_text(dims: Sequence[int | None]) -> str:
    """A shape as the runtime's messages write it: ``[?, 3, 640, 640]`` (``?``: an axis not known)."""
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def differs(got: int | None, expected: int | None) -> bool:
    """Whether an axis of an output differs from what the metadata means (None, not known, never does)."""
    return got is not None and expected is not None and got != expected


def output_shape_mismatch(shapes: Sequence[Sequence[int | None]], expected: Sequence[int | None],
                          what: str) -> str | None:
    """Why ``shapes`` are not the one output of ``expected`` shape that ``what`` (the metadata) means; None
    when they are."""
    if len(shapes) != 1:
        return f"one output expected, it has {len(shapes)}"
    if len(shapes[0]) != len(expected) or any(differs(g, e) for g, e in zip(shapes[0], expected)):
        return f"{what} mean an output of {shape_text(expected)}, it gives {shape_text(shapes[0])}"
    return None


def decoded_only_problem(kind: str, raw: bool, nms: bool) -> str | None:
    """Why the metadata of a ``kind`` model (``"segmentation"`` ...), whose exports give only decoded outputs,
    cannot say ``raw`` outputs or ``nms`` inside; None when it says neither."""
    if not (raw or nms):
        return None
    return (f"yolotrain metadata of a {kind} model with {'raw outputs' if raw else 'NMS inside'}, which its "
            "exports never have")


def _read_metadata(metadata: Mapping[str, str], path: Path) -> dict[str, Any]:
    """The yolotrain fields of an export's string metadata, each parsed and checked: one line naming the
    file and the field for a missing, malformed or out-of-range one."""
    def field(key: str, check: Callable[[Any], bool], what: str, default: Any = _REQUIRED) -> Any:
        text = metadata.get(key)
        if text is None and default is not _REQUIRED:
            return default
        try:
            value = text if key in ("precision", "task", "family") else json.loads(text)
        except (TypeError, ValueError, RecursionError):
            value = _REQUIRED
        if value is _REQUIRED or not check(value):
            shown = "missing" if text is None else f"got {brief(text)}"
            raise CheckpointError(f"{path}: yolotrain metadata field '{key}' must be {what} ({shown})")
        return value

    nc = field("nc", lambda v: _is_int(v) and 1 <= v <= MAX_CLASSES, f"an integer from 1 to {MAX_CLASSES}")
    # Ours are `class_names` and `strides`; `names` and `stride` hold the reference's forms (a {index: name}
    # literal, the largest stride) for its tools, and held our JSON lists in exports made before.
    current = "class_names" in metadata or "strides" in metadata
    names_key, strides_key = ("class_names", "strides") if current else ("names", "stride")
    names = field(names_key, lambda v: isinstance(v, list) and len(v) == nc and all(isinstance(n, str) for n in v),
                  f"a list of {nc} class names")
    names_of_tasks = [f'"{name}"' for name in task_names()]
    task = field("task", lambda v: v in task_names(), f"{', '.join(names_of_tasks[:-1])} or {names_of_tasks[-1]}",
                 "detect")
    outputs = get_task(task).export_outputs
    strides: list[int] = []  # the output levels, of the exports that predict boxes
    if BOXES in outputs:  # input sides are multiples of the largest stride (or of a coarser layer's)
        strides = field(strides_key, lambda v: isinstance(v, list) and 1 <= len(v) <= 8
                        and all(_is_stride(s) for s in v), "a list of 1 to 8 strides (whole numbers)")
        size_multiple = field("stride", lambda v: _is_stride(v) and v % max(strides) == 0,
                              f"a multiple of the largest of 'strides' {strides}") if current else max(strides)
    elif current:  # no output levels: `stride` alone is the multiple input sides round to
        size_multiple = field("stride", _is_stride, "a whole number from 1 to 1024")
    else:  # exports made before held a list of strides there
        size_multiple = max(field("stride", lambda v: isinstance(v, list) and 1 <= len(v) <= 8
                                  and all(_is_stride(s) for s in v), "a list of 1 to 8 strides (whole numbers)"))
    family = field("family", lambda v: v in family_names(), f"one of {', '.join(family_names())}", DEFAULT_FAMILY)
    # Only boxes are decoded with anchors, and only those of YOLOv5's anchor-based head.
    anchors = [] if BOXES not in outputs or family != DEFAULT_FAMILY else field(
        "anchors", lambda v: isinstance(v, list) and len(v) == len(strides) and all(
            isinstance(level, list) and 1 <= len(level) <= 16 and len(level) == len(v[0]) and all(
                isinstance(a, list) and len(a) == 2 and all(_is_number(x) and x > 0 for x in a) for a in level)
            for level in v), f"{len(strides)} levels (one per stride) of equally many (w, h) pairs")
    img_size = field("img_size", lambda v: isinstance(v, list) and len(v) == 2 and all(_is_int(s) and s > 0 for s in v),
                     "[height, width]")
    raw = field("raw", lambda v: isinstance(v, bool), "true or false")
    precision = field("precision", lambda v: isinstance(v, str) and len(v) <= 16, "a precision such as fp32", "fp32")
    nms = field("nms", lambda v: v is None or (isinstance(v, dict) and _is_int(v.get("max_det")) and 1 <= v["max_det"]
                and all(_is_number(v.get(k)) for k in ("conf", "iou")) and isinstance(v.get("multi_label"), bool)),
                "the NMS settings (conf, iou, max_det, multi_label)", None)
    nm = field("nm", lambda v: _is_int(v) and (v == 0) == (MASK_PROTOTYPES not in outputs) and 0 <= v <= 1024,
               "the number of mask coefficients (from 1 to 1024 for a segmentation model)", 0)
    kpt_shape = field("kpt_shape", lambda v: v is None or (isinstance(v, list) and len(v) == 2 and all(
        _is_int(k) for k in v) and 1 <= v[0] <= 1000 and v[1] in (2, 3)),
        "[keypoints 1..1000, 2 or 3 values each]", None)
    problem = get_task(task).exported_metadata_problem(raw, nms is not None)
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    if raw and family != DEFAULT_FAMILY:
        raise CheckpointError(f"{path}: yolotrain metadata of an {family} model with raw outputs, which its exports "
                              "never have")
    return {"nc": nc, "names": names, "strides": strides, "size_multiple": size_multiple, "anchors": anchors,
            "img_size": img_size, "raw": raw, "precision": precision, "nms": nms, "task": task, "nm": nm,
            "family": family, "kpt_shape": None if kpt_shape is None else tuple(kpt_shape)}


_REQUIRED = object()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_stride(value: Any) -> bool:
    return _is_int(value) and 1 <= value <= 1024


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
