"""The one interface every detector offers to evaluation, prediction and export, whatever runs it.

:class:`~yolotrain.model.Yolov5` (PyTorch) and every exported runtime
(:class:`~yolotrain.interop.runtime.ExportedModel`: ONNX Runtime, OpenVINO, LiteRT, TensorRT, TorchScript)
implement :class:`Detector`; :func:`yolotrain.interop.resolve.resolve_model` turns any model spec into one.
This module imports nothing of the project, so every layer can name the protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

import torch

Task = Literal["detect", "segment", "classify"]


@runtime_checkable
class Detector(Protocol):
    """A detector ready to run on ``[B, 3, H, W]`` float images (0..1) of :attr:`dtype` on :attr:`device`.

    Input sizes: a model with :attr:`dynamic_size` takes any sides that are multiples of
    :attr:`max_stride`; one without takes :attr:`fixed_size` only. ``model(imgs)`` returns the decoded
    ``[B, N, 5+nc]`` predictions (xywh, objectness, class scores) that NMS turns into detections —
    unless :attr:`end_to_end`, where NMS is part of the model and :class:`EndToEndDetector`'s
    ``detections`` gives the final boxes instead.

    A segmentation model (:attr:`task` ``"segment"``) returns ``(decoded, proto)``: ``decoded``
    ``[B, N, 5+nc+nm]`` has the model's ``num_masks`` raw mask coefficients after the class scores
    (its task tells NMS to carry them along), ``proto`` ``[B, nm, H/4, W/4]`` the prototype masks they
    weight; a detection's mask is ``sigmoid(coefficients @ proto) > 0.5`` inside its box (:mod:`yolotrain.eval.masks`).

    A classifier (:attr:`task` ``"classify"``) takes images normalised with the ImageNet mean and
    standard deviation and returns class logits ``[B, nc]``.
    """

    names: list[str]
    num_classes: int
    task: Task

    def __call__(self, imgs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

    @property
    def stride(self) -> torch.Tensor:
        """Strides of the output levels in pixels (8, 16, 32 and 64 on P6 models)."""

    @property
    def max_stride(self) -> int:
        """The largest stride: input sides must be multiples of it."""

    @property
    def dynamic_size(self) -> bool:
        """Whether any multiple of :attr:`max_stride` is accepted (else only :attr:`fixed_size`)."""

    @property
    def fixed_size(self) -> tuple[int, int] | None:
        """``(height, width)`` the model takes when it takes only one size; None with :attr:`dynamic_size`."""

    @property
    def default_img_size(self) -> int:
        """The input size the model was made for (its fixed size, else 640; 1280 for P6)."""

    @property
    def end_to_end(self) -> bool:
        """Whether NMS runs inside the model (then use ``detections``, not ``model(imgs)``)."""

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
class EndToEndDetector(Detector, Protocol):
    """A :class:`Detector` with NMS inside (:attr:`~Detector.end_to_end` is true)."""

    def detections(self, imgs: torch.Tensor, conf: float, iou: float, max_det: int, multi_label: bool = False,
                   classes: Sequence[int] | None = None, agnostic: bool = False) -> list[torch.Tensor]:
        """Per-image ``[n, 6]`` detections (xyxy, score, class) with the given NMS settings."""
