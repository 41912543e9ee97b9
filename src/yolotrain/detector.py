"""The one interface every model offers to evaluation, prediction and export, whatever runs it.

:class:`~yolotrain.model.Yolov5` and :class:`~yolotrain.model.classify.Classifier` (PyTorch) and every
exported runtime (:class:`~yolotrain.interop.runtime.ExportedModel`: ONNX Runtime, OpenVINO, LiteRT,
TensorRT, TorchScript) implement :class:`Detector`; :func:`yolotrain.interop.loading.resolve.resolve_model` turns
any model spec into one. What a model's outputs hold is its task's to say (:mod:`yolotrain.tasks`); the
models that predict boxes on output levels (detection, segmentation) are also :class:`BoxDetector`.
This module imports nothing of the project, so every layer can name the protocols.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

import torch

Task = Literal["detect", "segment", "classify", "pose", "obb"]


@runtime_checkable
class Detector(Protocol):
    """A model ready to run on ``[B, 3, H, W]`` float images of :attr:`dtype` on :attr:`device`.

    Input sizes: a model with :attr:`dynamic_size` takes any sides that are multiples of
    :attr:`size_multiple`; one without takes :attr:`fixed_size` only. What ``model(imgs)`` returns, and
    how its images are prepared, is its :attr:`task`'s (``tasks/detect``, ``tasks/segment``,
    ``tasks/classify``).
    """

    names: list[str]
    num_classes: int
    task: Task

    def __call__(self, imgs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]: ...

    @property
    def size_multiple(self) -> int:
        """Input sides are rounded to multiples of it: the model's total downsampling (a YOLO detector's
        largest stride, 32 for a classifier)."""

    @property
    def dynamic_size(self) -> bool:
        """Whether any multiple of :attr:`size_multiple` is accepted (else only :attr:`fixed_size`)."""

    @property
    def fixed_size(self) -> tuple[int, int] | None:
        """``(height, width)`` the model takes when it takes only one size; None with :attr:`dynamic_size`."""

    @property
    def default_img_size(self) -> int:
        """The input size the model was made for (its fixed size, else its task's: 640, 1280 for P6, 224 for
        a classifier)."""

    @property
    def device(self) -> torch.device:
        """Where the model's inputs go."""

    @property
    def dtype(self) -> torch.dtype:
        """The floating type the model's inputs must have."""

    @property
    def precision(self) -> str:
        """The precision the model computes in: ``fp32``, ``fp16``, ``bf16`` or ``int8``."""


@runtime_checkable
class BoxDetector(Detector, Protocol):
    """A :class:`Detector` that predicts boxes on output levels of increasing stride (detection and
    segmentation models): ``model(imgs)`` gives the decoded predictions NMS turns into detections, unless
    :attr:`end_to_end`, where NMS is part of the model and :class:`EndToEndDetector`'s ``detections`` gives
    the final boxes instead."""

    @property
    def stride(self) -> torch.Tensor:
        """Strides of the output levels in pixels (8, 16, 32 and 64 on P6 models)."""

    @property
    def max_stride(self) -> int:
        """The largest stride."""

    @property
    def end_to_end(self) -> bool:
        """Whether NMS runs inside the model (then use ``detections``, not ``model(imgs)``)."""


@runtime_checkable
class EndToEndDetector(BoxDetector, Protocol):
    """A :class:`BoxDetector` with NMS inside (:attr:`~BoxDetector.end_to_end` is true)."""

    def detections(self, imgs: torch.Tensor, conf: float, iou: float, max_det: int, multi_label: bool = False,
                   classes: Sequence[int] | None = None, agnostic: bool = False) -> list[torch.Tensor]:
        """Per-image ``[n, 6]`` detections (xyxy, score, class) with the given NMS settings."""
