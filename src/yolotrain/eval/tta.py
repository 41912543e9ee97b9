"""Detectors made of other detectors, as the reference's ``--augment`` and several ``--weights`` make them.

- :class:`AugmentedDetector`: test-time augmentation, the reference's ``Model._forward_augment``
  (yolov5 7.0): each batch runs at three scales (1, 0.83 and 0.67, the middle one flipped left-right),
  the predictions are mapped back to the input's pixels, the first scale's coarsest level (large objects,
  better found at the smaller scales) and the last scale's finest level (small objects) are dropped, and
  the rest are concatenated for one NMS.
- :class:`EnsembleDetector`: the reference's ``Ensemble`` (its "NMS ensemble"): the members' predictions
  concatenated along the prediction axis, so one NMS merges the models' detections.

Both are detection-only PyTorch modules presenting the :class:`~yolotrain.detector.BoxDetector` interface of
the models inside them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..model import Yolov5
from ..task import task_of

# The reference's test-time scales and, for each, whether the batch is flipped left-right first.
TTA_SCALES = (1.0, 0.83, 0.67)
TTA_FLIPS = (False, True, False)
# The value the reference pads scaled images with (ImageNet's mean grey).
TTA_PAD_VALUE = 0.447


def scale_images(imgs: torch.Tensor, ratio: float, stride: int) -> torch.Tensor:
    """``imgs [B, C, H, W]`` resized bilinearly by ``ratio`` (sides truncated to whole pixels), then padded
    right and bottom with :data:`TTA_PAD_VALUE` up to the next multiples of ``stride`` of the scaled sides
    (the reference's ``scale_img`` with ``gs=stride``)."""
    if ratio == 1.0:
        return imgs
    h, w = imgs.shape[2:]
    size = (int(h * ratio), int(w * ratio))
    resized = F.interpolate(imgs, size=size, mode="bilinear", align_corners=False)
    padded_h, padded_w = (math.ceil(side * ratio / stride) * stride for side in (h, w))
    return F.pad(resized, [0, padded_w - size[1], 0, padded_h - size[0]], value=TTA_PAD_VALUE)


class _Composite(nn.Module):
    """The :class:`~yolotrain.detector.BoxDetector` attributes of a detector made of PyTorch box models (their
    task and mask coefficients too), read from ``self.lead`` (the member with the largest stride) and
    ``self.first``."""

    lead: Yolov5
    first: Yolov5
    end_to_end = False
    dynamic_size = True
    fixed_size = None

    @property
    def task(self) -> str:
        return self.first.task

    @property
    def names(self) -> list[str]:
        return self.first.names

    @property
    def num_classes(self) -> int:
        return self.first.num_classes

    @property
    def num_masks(self) -> int:
        return self.first.num_masks

    @property
    def stride(self) -> torch.Tensor:
        return self.lead.stride

    @property
    def max_stride(self) -> int:
        return self.lead.max_stride

    @property
    def size_multiple(self) -> int:
        return self.lead.size_multiple

    @property
    def default_img_size(self) -> int:
        return self.lead.default_img_size

    @property
    def device(self) -> torch.device:
        return self.first.device

    @property
    def dtype(self) -> torch.dtype:
        return self.first.dtype

    @property
    def precision(self) -> str:
        return self.first.precision


class AugmentedDetector(_Composite):
    """A detection :class:`~yolotrain.Yolov5` run with the reference's test-time augmentation: its
    ``[B, N', 5+nc]`` predictions (in the input's pixels) gather those of the three scales."""

    def __init__(self, model: Yolov5) -> None:
        super().__init__()
        if task_of(model).augment_refusal(type(model).__name__) is not None:
            raise ValueError(f"test-time augmentation runs detection models, not a {model.task} model")
        self.model = model

    @property
    def lead(self) -> Yolov5:  # type: ignore[override]
        return self.model

    @property
    def first(self) -> Yolov5:  # type: ignore[override]
        return self.model

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        h, w = imgs.shape[2:]
        stride = self.model.max_stride
        outputs = []
        for scale, flip in zip(TTA_SCALES, TTA_FLIPS):
            scaled = scale_images(imgs.flip(3) if flip else imgs, scale, stride)
            pred = self.model(scaled)
            x, y, wh = pred[..., :1] / scale, pred[..., 1:2] / scale, pred[..., 2:4] / scale
            if flip:
                x = w - x
            outputs.append(torch.cat((x, y, wh, pred[..., 4:]), -1))
        # The reference's _clip_augmented: the first scale without its coarsest level (large objects),
        # the last without its finest (small objects); levels are in stride order in the prediction axis.
        outputs[0] = outputs[0][:, :-self._level_size(h, w, -1)]
        last_h, last_w = (math.ceil(side * TTA_SCALES[-1] / stride) * stride for side in (h, w))
        outputs[-1] = outputs[-1][:, self._level_size(last_h, last_w, 0):]
        return torch.cat(outputs, 1)

    def _level_size(self, h: int, w: int, level: int) -> int:
        """The predictions of output level ``level`` for an ``h`` x ``w`` input: anchors x grid cells."""
        s = int(self.model.stride[level])
        return self.model.head.na * (h // s) * (w // s)


class EnsembleDetector(_Composite):
    """Detection models of the same classes run on the same batch, their ``[B, N_i, 5+nc]`` predictions
    concatenated into ``[B, sum N_i, 5+nc]`` (each member may be an :class:`AugmentedDetector`)."""

    def __init__(self, members: Sequence[Yolov5 | AugmentedDetector]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    @property
    def lead(self) -> Yolov5:  # type: ignore[override]
        # As the reference: the ensemble's stride is its member's with the largest one (P6 over P5).
        return max((_model(m) for m in self.members), key=lambda m: m.max_stride)

    @property
    def first(self) -> Yolov5:  # type: ignore[override]
        return _model(self.members[0])

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        return torch.cat([member(imgs) for member in self.members], 1)


def _model(member: Yolov5 | AugmentedDetector) -> Yolov5:
    return member.model if isinstance(member, AugmentedDetector) else member
