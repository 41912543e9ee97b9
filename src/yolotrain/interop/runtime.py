"""Exported detectors run through their own runtimes behind the call shape of :class:`Yolov5`.

Every export written by :func:`~yolotrain.interop.export.export` carries the same string metadata
(class names, strides, anchors, image size, precision, and for ``--nms`` exports the built-in NMS
settings). :class:`ExportedModel` reads it and does the format-independent part: input-shape checks,
running fixed-batch models one image at a time, decoding raw head maps, and applying a built-in
NMS's settings. Each runtime (onnxruntime, OpenVINO, LiteRT, TensorRT, TorchScript) only supplies
:meth:`ExportedModel._run`.
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from ..checkpoint import CheckpointError
from ..model import Detect

# Suffix of the file a runtime loads → (backend module, class name); imported on demand so that a
# missing optional runtime only matters to the files that need it.
BACKENDS: dict[str, tuple[str, str]] = {
    ".onnx": ("onnx_backend", "OnnxModel"),
    ".xml": ("openvino_backend", "OpenVinoModel"),
    ".tflite": ("tflite_backend", "TfliteModel"),
    ".engine": ("tensorrt_backend", "TensorRtModel"),
    ".torchscript": ("torchscript_backend", "TorchScriptModel"),
}
# Exports that this platform cannot run, with the reason given to the user.
NOT_RUNNABLE = {".mlpackage": "yolotrain does not run Core ML models: Core ML prediction needs macOS "
                               "(load the .mlpackage there with coremltools or Xcode)"}


def is_exported(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an export (by suffix) rather than a checkpoint."""
    return Path(path).suffix.lower() in BACKENDS.keys() | NOT_RUNNABLE.keys()


def load_exported(path: str | os.PathLike, trust_code: bool = False) -> ExportedModel:
    """The runtime-backed detector for an exported file (``.onnx``, ``.xml``, ``.tflite``, ``.engine``,
    ``.torchscript``). TorchScript files and TensorRT engines run their own code when loaded, so they
    are refused unless ``trust_code`` (see :mod:`.trust`)."""
    suffix = Path(path).suffix.lower()
    if suffix in NOT_RUNNABLE:
        raise CheckpointError(f"{path}: {NOT_RUNNABLE[suffix]}")
    if suffix not in BACKENDS:
        raise CheckpointError(f"{path}: not an exported model (expected one of {', '.join(BACKENDS)})")
    from importlib import import_module

    from .trust import needs_trust, require_trust

    require_trust(path, trust_code)  # before the backend's runtime is even imported
    module, name = BACKENDS[suffix]
    backend = getattr(import_module(f"{__package__}.{module}"), name)
    return backend(path, trust_code=trust_code) if needs_trust(path) else backend(path)


class ExportedModel(abc.ABC):
    """Base of the runtime backends: metadata, shape checks and decoding shared by every format.

    ``model(imgs)`` takes ``[B, 3, H, W]`` float images (0..1) and returns the decoded ``[B, N, 5+nc]``
    output on the images' device, like ``Yolov5.eval()``; exports with NMS inside instead answer
    :meth:`detections`. ``names``, ``stride``, ``num_classes``, ``img_size``, ``precision`` and
    ``end_to_end`` come from the file's metadata.
    """

    format_name = "exported"

    def __init__(self, path: str | os.PathLike, metadata: Mapping[str, str],
                 input_shape: Sequence[int | None]) -> None:
        self.path = Path(path)
        if metadata.get("producer") != "yolotrain":
            raise CheckpointError(f"{self.path}: {self.format_name} file without yolotrain metadata "
                                  "(export it with yolotrain export)")
        self.num_classes = int(metadata["nc"])
        self.names: list[str] = json.loads(metadata["names"])
        self.stride = torch.tensor(json.loads(metadata["stride"]), dtype=torch.float32)
        self.img_size: tuple[int, int] = tuple(json.loads(metadata["img_size"]))
        self.raw: bool = json.loads(metadata["raw"])
        self.precision: str = metadata.get("precision", "fp32")
        nms = metadata.get("nms")
        self.nms_settings: dict | None = json.loads(nms) if nms else None
        # Fixed axes are ints, free ones None (the runtimes name or mark them differently).
        self.input_shape = [s if isinstance(s, int) and s > 0 else None for s in input_shape]
        # Raw exports leave decoding to the caller; Detect owns that maths, so reuse it (its 1-channel
        # convolutions are never run).
        levels = len(self.stride)
        self._decoder = Detect(self.num_classes, torch.tensor(json.loads(metadata["anchors"])), (1,) * levels,
                               tuple(int(s) for s in self.stride.tolist())) if self.raw else None

    @property
    def end_to_end(self) -> bool:
        """Whether NMS is part of the exported graph (outputs are final detections)."""
        return self.nms_settings is not None

    @property
    def dynamic_size(self) -> bool:
        return self.input_shape[2] is None or self.input_shape[3] is None

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
            return [torch.from_numpy(np.ascontiguousarray(o)) for o in self._run(batch)]
        if self.input_shape[0] != 1:
            raise ValueError(f"{self.path.name} expects batches of {self.input_shape[0]}, got {len(batch)}")
        # A batch-1 export: run the images one by one and stack the results.
        per_image = [self._run(batch[i:i + 1]) for i in range(len(batch))]
        return [torch.from_numpy(np.concatenate(outs)) for outs in zip(*per_image)]

    def __call__(self, imgs: torch.Tensor) -> torch.Tensor:
        """Decoded ``[B, N, 5+nc]`` predictions for ``imgs`` ``[B, 3, H, W]``."""
        if self.end_to_end:
            raise ValueError(f"{self.path.name} has NMS inside: it returns detections, not raw predictions")
        outputs = self._forward(imgs)
        decoded = self._decoder.decode(outputs) if self._decoder is not None else outputs[0]
        return decoded.to(imgs.device)

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
                f"precision={self.precision!r}{', nms' if self.end_to_end else ''})")
