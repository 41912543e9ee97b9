"""The task-aligned assigner (TAL, Feng et al., 2021) of the anchor-free losses.

Each target takes, among the anchor points inside its box, the ``topk`` whose prediction aligns best with it:
the predicted score of its class to the power ``alpha`` times the CIoU of the predicted box to the power
``beta``. An anchor point claimed by several targets goes to the target whose box its prediction overlaps
most. The class targets are soft: each positive's alignment, rescaled so that every target's best positive
reaches that target's best overlap.

Semantics follow ultralytics' ``TaskAlignedAssigner`` (``utils/tal.py``), the assignment YOLOv8, YOLO11 and
YOLOv5u are trained with, including its details: sides of targets narrower than ``min_side`` are widened to it
about the centre when choosing the points inside, and a point claimed twice goes to the largest overlap among
all targets whose (widened) box holds it. Every image is assigned at once, on targets padded to the largest
count of any image. :class:`RotatedTaskAlignedAssigner` is the same assignment of rotated boxes (ultralytics'
``RotatedTaskAlignedAssigner``): the points inside a rotated box, ProbIoU for the overlap.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..boxes import xywh_to_xyxy, xyxy_to_xywh
from ..rotated import probiou_pairs, xywhr_to_corners

# Margins of the assigner's divisions and of the inside-the-box test, the reference's values.
ALIGN_EPS = 1e-9


class Assignment(NamedTuple):
    """Per image and anchor point (``[B, A]`` leading dimensions): the assigned target's class, its box (as the
    targets give it: xyxy, or xywhr for the rotated assigner), the soft class targets ``[B, A, nc]`` (zero off the
    foreground), whether the point is foreground, and the assigned target's position among its image's targets (0
    off the foreground)."""

    labels: torch.Tensor
    boxes: torch.Tensor
    scores: torch.Tensor
    foreground: torch.Tensor
    target_index: torch.Tensor


def complete_iou_xyxy(box1: torch.Tensor, box2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Element-wise Complete IoU of aligned (x1, y1, x2, y2) boxes; shape ``(...)``.

    The anchor-free models' variant, which they were trained with: ``eps`` is added to both heights (so a
    collapsed box has a finite aspect ratio) and α is a constant in the gradient, as in
    :func:`yolotrain.boxes.complete_iou`.
    """
    b1_x1, b1_y1, b1_x2, b1_y2 = box1.unbind(-1)
    b2_x1, b2_y1, b2_x2, b2_y2 = box2.unbind(-1)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps

    inter = ((b1_x2.minimum(b2_x2) - b1_x1.maximum(b2_x1)).clamp(min=0)
             * (b1_y2.minimum(b2_y2) - b1_y1.maximum(b2_y1)).clamp(min=0))
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union

    enclosing_w = b1_x2.maximum(b2_x2) - b1_x1.minimum(b2_x1)
    enclosing_h = b1_y2.maximum(b2_y2) - b1_y1.minimum(b2_y1)
    diagonal_sq = enclosing_w.pow(2) + enclosing_h.pow(2) + eps
    centre_dist_sq = ((b2_x1 + b2_x2 - b1_x1 - b1_x2).pow(2) + (b2_y1 + b2_y2 - b1_y1 - b1_y2).pow(2)) / 4
    v = (4 / math.pi**2) * ((w2 / h2).atan() - (w1 / h1).atan()).pow(2)
    with torch.no_grad():
        alpha = v / (1 - iou + v + eps)
    return iou - (centre_dist_sq / diagonal_sq + v * alpha)


class TaskAlignedAssigner:
    """``assigner(scores, boxes, points, gt_labels, gt_boxes, gt_valid)`` → :class:`Assignment`.

    ``scores`` ``[B, A, nc]`` are predicted probabilities, ``boxes`` ``[B, A, 4]`` predicted xyxy boxes and
    ``points`` ``[A, 2]`` the anchor points, all in pixels; the targets are padded per image: ``gt_labels``
    ``[B, M]``, ``gt_boxes`` ``[B, M, 4]`` (xyxy pixels) and ``gt_valid`` ``[B, M]`` (false on padding).
    Nothing of it is differentiated: the assignment is a constant of the loss.
    """

    def __init__(self, num_classes: int, topk: int = 10, alpha: float = 0.5, beta: float = 6.0,
                 min_side: float = 16.0) -> None:
        self.num_classes = num_classes
        self.topk = topk
        self.alpha = alpha
        self.beta = beta
        self.min_side = min_side

    @torch.no_grad()
    def __call__(self, scores: torch.Tensor, boxes: torch.Tensor, points: torch.Tensor, gt_labels: torch.Tensor,
                 gt_boxes: torch.Tensor, gt_valid: torch.Tensor) -> Assignment:
        batch_size, num_points, _ = scores.shape
        gt_labels = gt_labels.long()
        if gt_boxes.shape[1] == 0:
            return Assignment(labels=scores.new_full((batch_size, num_points), self.num_classes, dtype=torch.long),
                              boxes=torch.zeros_like(boxes), scores=torch.zeros_like(scores),
                              foreground=scores.new_zeros((batch_size, num_points), dtype=torch.bool),
                              target_index=scores.new_zeros((batch_size, num_points), dtype=torch.long))

        candidates = self._points_inside(points, gt_boxes, gt_valid) & gt_valid[..., None]    # [B, M, A]
        alignment, overlaps = self._alignment(scores, boxes, gt_labels, gt_boxes, candidates)
        # Each target's best-aligned points (padding targets take none), kept where they lie inside it.
        topk = torch.topk(alignment, min(self.topk, num_points), dim=-1).indices
        chosen = torch.zeros_like(candidates).scatter(-1, topk, True)
        positive = chosen & candidates
        positive = self._one_target_per_point(positive, overlaps)

        foreground = positive.any(1)                                                           # [B, A]
        # Each point has one positive target at most: its index is the sum over targets (an argmax across the
        # middle dimension is several times slower on the CPU).
        target_positions = torch.arange(positive.shape[1], device=positive.device)[:, None]     # [M, 1]
        target_index = torch.where(positive, target_positions, 0).sum(1)                       # 0 off the foreground
        labels = gt_labels.gather(1, target_index)
        assigned_boxes = gt_boxes.gather(1, target_index[..., None].expand(-1, -1, gt_boxes.shape[-1]))

        # Soft class targets: each positive's alignment over its target's best alignment, times the target's best
        # overlap; a point keeps the largest of these over its targets (one, after the step above).
        positive_alignment = alignment * positive
        best_alignment = positive_alignment.amax(-1, keepdim=True)
        best_overlap = (overlaps * positive).amax(-1, keepdim=True)
        strength = (positive_alignment * best_overlap / (best_alignment + ALIGN_EPS)).amax(1)  # [B, A]
        classes = torch.arange(self.num_classes, device=labels.device)
        target_class = (classes == labels[..., None]) & foreground[..., None]                    # [B, A, nc]
        scores = torch.where(target_class, strength[..., None], 0.0)
        return Assignment(labels=labels, boxes=assigned_boxes, scores=scores, foreground=foreground,
                          target_index=target_index)

    def _points_inside(self, points: torch.Tensor, gt_boxes: torch.Tensor, gt_valid: torch.Tensor) -> torch.Tensor:
        """``[B, M, A]``: the points strictly inside each target's box, its sides widened to ``min_side`` at least
        (about its centre), so that a tiny target still has points to choose from."""
        xywh = xyxy_to_xywh(gt_boxes)
        narrow = (xywh[..., 2:] < self.min_side) & gt_valid[..., None]
        sides = torch.where(narrow, torch.full_like(xywh[..., 2:], self.min_side), xywh[..., 2:])
        widened = xywh_to_xyxy(torch.cat((xywh[..., :2], sides), -1))
        x1, y1, x2, y2 = widened[..., None].unbind(-2)                                         # [B, M, 1] each
        x, y = points.unbind(-1)
        return (x - x1 > ALIGN_EPS) & (y - y1 > ALIGN_EPS) & (x2 - x > ALIGN_EPS) & (y2 - y > ALIGN_EPS)

    def _alignment(self, scores: torch.Tensor, boxes: torch.Tensor, gt_labels: torch.Tensor, gt_boxes: torch.Tensor,
                   candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, M, A]`` alignment metric and overlap (clamped at 0) of each candidate pair, zero elsewhere;
        computed only for the candidates."""
        image, target, point = candidates.nonzero(as_tuple=True)
        class_scores = scores[image, point, gt_labels[image, target]]
        overlap = self._overlap(gt_boxes[image, target], boxes[image, point]).clamp(min=0)
        overlaps = torch.zeros(candidates.shape, dtype=boxes.dtype, device=boxes.device)
        overlaps = overlaps.index_put((image, target, point), overlap)
        alignment = torch.zeros(candidates.shape, dtype=scores.dtype, device=scores.device)
        alignment = alignment.index_put((image, target, point), class_scores.pow(self.alpha) * overlap.pow(self.beta))
        return alignment, overlaps

    @staticmethod
    def _overlap(gt_boxes: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """The overlap of aligned target and predicted boxes ``[n, 4]``: their CIoU."""
        return complete_iou_xyxy(gt_boxes, boxes)

    @staticmethod
    def _one_target_per_point(positive: torch.Tensor, overlaps: torch.Tensor) -> torch.Tensor:
        """A point positive for several targets keeps only the target it overlaps most (among all candidates)."""
        claimed_twice = positive.sum(1, keepdim=True) > 1                                       # [B, 1, A]
        targets = torch.arange(overlaps.shape[1], device=overlaps.device)[:, None]              # [M, 1]
        best = targets == overlaps.max(1, keepdim=True).indices                                 # [B, M, A]
        return torch.where(claimed_twice, best, positive)


class RotatedTaskAlignedAssigner(TaskAlignedAssigner):
    """:class:`TaskAlignedAssigner` of rotated boxes: ``boxes`` ``[B, A, 5]`` and ``gt_boxes`` ``[B, M, 5]`` are
    xywhr (pixels, radians); a point is inside a target when it lies in its rotated rectangle (edges included, as
    the reference tests it), and the overlap is the boxes' ProbIoU."""

    def _points_inside(self, points: torch.Tensor, gt_boxes: torch.Tensor, gt_valid: torch.Tensor) -> torch.Tensor:
        """``[B, M, A]``: the points inside each target's rotated box, its sides widened to ``min_side`` at least
        (about its centre): the projection of the point from a corner onto both sides from that corner lies within
        the side."""
        narrow = (gt_boxes[..., 2:4] < self.min_side) & gt_valid[..., None]
        sides = torch.where(narrow, torch.full_like(gt_boxes[..., 2:4], self.min_side), gt_boxes[..., 2:4])
        corners = xywhr_to_corners(torch.cat((gt_boxes[..., :2], sides, gt_boxes[..., 4:]), -1))  # [B, M, 4, 2]
        corner, side_end, other_end = corners[..., 0, None, :], corners[..., 1, None, :], corners[..., 3, None, :]
        side, other = side_end - corner, other_end - corner                                     # [B, M, 1, 2]
        from_x = points[:, 0] - corner[..., 0]                                                # [B, M, A]
        from_y = points[:, 1] - corner[..., 1]
        along_side = from_x * side[..., 0] + from_y * side[..., 1]
        along_other = from_x * other[..., 0] + from_y * other[..., 1]
        side_sq, other_sq = (side * side).sum(-1), (other * other).sum(-1)
        return (along_side >= 0) & (along_side <= side_sq) & (along_other >= 0) & (along_other <= other_sq)

    @staticmethod
    def _overlap(gt_boxes: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """The ProbIoU of aligned target and predicted xywhr boxes ``[n, 5]``."""
        return probiou_pairs(gt_boxes, boxes)
