"""The anchor-free oriented-box loss (YOLOv8-obb, YOLO11-obb, YOLOv5u-obb): ProbIoU and distribution focal loss of
the rotated boxes, class BCE against the rotated task-aligned assigner's soft targets, and the angle term.

Semantics follow ultralytics 8.4's ``v8OBBLoss`` (``utils/loss.py``, with ``RotatedBboxLoss`` and
``RotatedTaskAlignedAssigner``). Every anchor point predicts, per side, a distribution over ``reg_max`` distances
measured along the box's own axes, one logit per class and one angle logit (the angle is ``(sigmoid - 1/4) * pi``).
The box term is 1 - ProbIoU (each side's variance floored at 0.01 square strides), the DFL is taken against the
target's distances along its axes, the angle term is sin²(2 Δθ) scaled down for elongated targets; all weighted by
each positive's soft class target and divided by the sum of those targets, as the class BCE is. Targets under 2
pixels wide or high are dropped first, as the reference drops them. The total is (box + cls + dfl + angle) × batch
size. The loss never writes into its inputs nor into any tensor autograd saved.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..rotated import probiou_pairs
from ..settings import from_mapping, setting
from .anchor_free import AnchorFreeLoss, AnchorFreeLossConfig, Predictions, _distribution_focal_loss, padded_rows
from .assign import RotatedTaskAlignedAssigner

# Targets narrower or lower than this many pixels are dropped (the reference's filter of tiny rotated boxes).
MIN_TARGET_SIDE = 2.0
# Added to each side's variance (square strides) in the box term's ProbIoU, bounding the gradient of boxes smaller
# than a stride; the reference's RotatedBboxLoss.floor.
PROBIOU_FLOOR = 0.01
# How fast the angle term fades as a target's sides differ: its weight is exp(-log(w/h)² / ASPECT_SCALE²).
ASPECT_SCALE = 3.0
ASPECT_EPS = 1e-9
TARGET_COLUMNS = 7  # image index, class, cx, cy, w, h, angle


@dataclass(frozen=True)
class AnchorFreeOBBLossConfig(AnchorFreeLossConfig):
    """:class:`AnchorFreeLossConfig` and the angle term's gain; ultralytics' defaults (``cfg/default.yaml``)."""

    angle: float = setting(1.0, "angle loss gain (oriented boxes)", min=0)


class PaddedRotatedTargets(NamedTuple):
    """The targets per image, padded to the largest count of any image: classes ``[B, M]``, boxes ``[B, M, 5]``
    (xywhr: pixels, radians) and which entries are targets ``[B, M]``."""

    labels: torch.Tensor
    boxes: torch.Tensor
    valid: torch.Tensor


def obb_targets_to_tensor(targets: torch.Tensor | np.ndarray, device: torch.device | None = None) -> torch.Tensor:
    """The ``[N, 7]`` targets (image index, class, cx, cy, w, h normalised, angle in radians) as a float tensor."""
    table = torch.as_tensor(targets, dtype=torch.float32, device=device)
    if table.numel() == 0:
        table = table.reshape(0, TARGET_COLUMNS)
    if table.ndim != 2 or table.shape[1] != TARGET_COLUMNS:
        raise ValueError(f"oriented-box targets must be [N, 7] (image, class, cx, cy, w, h, angle), "
                         f"got shape {tuple(table.shape)}")
    return table


def padded_rotated_targets(targets: torch.Tensor, batch_size: int, pixels: torch.Tensor) -> PaddedRotatedTargets:
    """The ``[N, 7]`` targets as the assigner takes them: centres and sides times ``pixels`` (width, height, width,
    height), the angle as it is; each image's targets in their order."""
    rows = padded_rows(targets[:, 0].long(), batch_size)
    valid = rows >= 0
    chosen = targets[rows.clamp(min=0)]                                                      # [B, M, 7]
    labels = torch.where(valid, chosen[..., 1], 0.0)
    boxes = torch.where(valid[..., None], torch.cat((chosen[..., 2:6] * pixels, chosen[..., 6:]), -1), 0.0)
    return PaddedRotatedTargets(labels, boxes, valid)


def rotated_boxes(distances: torch.Tensor, angle: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """``[..., 5]`` xywhr boxes from the distances ``[..., 4]`` (left, top, right, bottom, along the box's axes) of
    the points ``[..., 2]`` and the angles ``[..., 1]``: the centre is the point moved by half the difference of
    opposite distances, turned by the angle."""
    left_top, right_bottom = distances.split(2, -1)
    along_x, along_y = ((right_bottom - left_top) / 2).split(1, -1)
    cos, sin = angle.cos(), angle.sin()
    centre = torch.cat((along_x * cos - along_y * sin, along_x * sin + along_y * cos), -1) + points
    return torch.cat((centre, left_top + right_bottom, angle), -1)


def rotated_distances(boxes: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`rotated_boxes`: the distances ``[..., 4]`` from the points to the sides of the xywhr
    boxes ``[..., 5]``, along the boxes' axes."""
    offset_x, offset_y = (boxes[..., :2] - points).split(1, -1)
    cos, sin = boxes[..., 4:5].cos(), boxes[..., 4:5].sin()
    along_x = offset_x * cos + offset_y * sin
    along_y = -offset_x * sin + offset_y * cos
    half_w, half_h = boxes[..., 2:3] / 2, boxes[..., 3:4] / 2
    return torch.cat((half_w - along_x, half_h - along_y, half_w + along_x, half_h + along_y), -1)


def angle_loss(predicted: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per box ``[n]``: sin²(2 Δθ) of the predicted angles ``[n]`` against the xywhr targets ``[n, 5]`` (Δθ wrapped
    to a half turn: a rectangle turned by pi is itself), weighted by exp(-log(w/h)² / 9), so that the angle of a
    nearly square target, which hardly matters, hardly counts."""
    log_aspect = ((targets[:, 2] + ASPECT_EPS) / (targets[:, 3] + ASPECT_EPS)).log()
    aspect_weight = (-log_aspect.pow(2) / ASPECT_SCALE**2).exp()
    delta = predicted - targets[:, 4]
    wrapped = delta - torch.round(delta / math.pi) * math.pi
    return aspect_weight * torch.sin(2 * wrapped).pow(2)


class AnchorFreeOBBLoss(AnchorFreeLoss):
    """``criterion(outputs, targets, pred_size=imgs.shape[2:4])`` → scalar loss.

    ``outputs`` are the train-mode maps of an OBB head, one ``[B, 4 * reg_max + nc + 1, H, W]`` per level (box
    distributions, class logits, the angle logit); ``targets`` are ``[N, 7]``: image index, class, cx, cy, w, h
    (normalised to the input) and the angle in radians. The total is (box + cls + dfl + angle) × batch size;
    ``self.components`` holds the four detached parts in that order, ultralytics' order. ``rect_training`` and
    ``img_size`` as :class:`AnchorFreeLoss` takes them; ``hyp`` adds the angle gain to its settings.
    """

    component_names = ("box", "cls", "dfl", "angle")

    def __init__(self, model: nn.Module, rect_training: bool = False, img_size: int | None = None,
                 hyp: AnchorFreeLossConfig | Mapping[str, float] | None = None) -> None:
        if isinstance(hyp, AnchorFreeLossConfig) and not isinstance(hyp, AnchorFreeOBBLossConfig):
            hyp = AnchorFreeOBBLossConfig(**dataclasses.asdict(hyp))
        hyp = hyp if isinstance(hyp, AnchorFreeOBBLossConfig) else from_mapping(AnchorFreeOBBLossConfig, hyp or {})
        super().__init__(model, rect_training, img_size, hyp)
        head = getattr(model, "module", model).head
        if getattr(head, "ne", 0) != 1 or self.nm:
            raise ValueError("the oriented-box loss needs an OBB head (one angle channel, no mask coefficients)")
        self.assigner = RotatedTaskAlignedAssigner(self.nc, topk=self.hyp.topk, alpha=self.hyp.alpha,
                                                   beta=self.hyp.beta, min_side=self.assigner.min_side)

    _targets_tensor = staticmethod(obb_targets_to_tensor)

    def _extra_channels(self) -> tuple[int, str]:
        return 1, "angle"

    def __call__(self, outputs: Sequence[torch.Tensor], targets: torch.Tensor | np.ndarray,
                 pred_size: Sequence[int] | None = None) -> torch.Tensor:
        maps, targets = self._prepare(outputs, targets, pred_size)
        batch_size = maps[0].shape[0]
        predictions = Predictions(maps, self.strides, self.reg_max, self.nc)
        sides = targets[:, 4:6] * predictions.pixels[:2]
        targets = targets[(sides >= MIN_TARGET_SIDE).all(1)]
        padded = padded_rotated_targets(targets, batch_size, predictions.pixels)
        strides = predictions.strides
        # The angle logit is the head's last channel; the angle is (sigmoid - 1/4) * pi, as the head decodes it.
        angle = (predictions.coefficients.sigmoid() - 0.25) * math.pi                          # [B, A, 1]
        boxes = rotated_boxes(predictions.distances, angle, predictions.points)                 # [B, A, 5], strides
        boxes_in_pixels = torch.cat((boxes[..., :4] * strides, boxes[..., 4:]), -1).detach()
        assignment = self.assigner(predictions.class_logits.detach().sigmoid(), boxes_in_pixels,
                                   predictions.points * strides, padded.labels, padded.boxes, padded.valid)
        score_sum = assignment.scores.sum().clamp(min=1)
        lcls = F.binary_cross_entropy_with_logits(predictions.class_logits, assignment.scores, reduction="sum")

        # The box, DFL and angle terms on the foreground only, each weighted by its soft class target; in strides.
        image, point = assignment.foreground.nonzero(as_tuple=True)
        weight = assignment.scores[image, point].sum(-1)
        assigned = assignment.boxes[image, point]
        target_boxes = torch.cat((assigned[:, :4] / strides[point], assigned[:, 4:]), -1)
        predicted = boxes[image, point]
        lbox = ((1.0 - probiou_pairs(predicted, target_boxes, floor=PROBIOU_FLOOR)) * weight).sum()
        distances = rotated_distances(target_boxes, predictions.points[point])
        ldfl = (_distribution_focal_loss(predictions.distributions[image, point], distances) * weight).sum()
        langle = (angle_loss(predicted[:, 4], target_boxes) * weight).sum()

        parts = torch.stack((lbox / score_sum * self.hyp.box, lcls / score_sum * self.hyp.cls,
                             ldfl / score_sum * self.hyp.dfl, langle / score_sum * self.hyp.angle))
        self.components = parts.detach()
        total = parts.sum() * batch_size
        if torch.is_grad_enabled():  # a training step; validation only reports its loss
            self._check_diverged(total, maps)
        return total
