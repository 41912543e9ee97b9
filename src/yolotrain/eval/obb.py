"""Scoring rotated detections: :class:`RotatedDetectionStats` matches them to rotated labels by ProbIoU."""

from __future__ import annotations

import torch

from ..rotated import probiou
from .metrics import IOU_THRESHOLDS, ULTRALYTICS_SCORING, DetectionStats, ScoringRules, match_by_iou


class RotatedDetectionStats(DetectionStats):
    """:class:`DetectionStats` of rotated boxes, the overlap of a detection and a label their ProbIoU (as
    Ultralytics' OBB validation); Ultralytics' scoring rules unless told otherwise, since its models are the
    published rotated ones."""

    def __init__(self, nc: int, iou_thresholds: torch.Tensor = IOU_THRESHOLDS,
                 rules: ScoringRules = ULTRALYTICS_SCORING) -> None:
        super().__init__(nc, iou_thresholds, rules)

    def update(self, detections: torch.Tensor, gt_boxes: torch.Tensor, gt_cls: torch.Tensor) -> None:
        """Add one image: ``detections [n, 7]`` (cx, cy, w, h, score, class, angle; sorted by score, as
        :func:`~yolotrain.nms.rotated_non_max_suppression` gives them) and labels ``[m, 5]`` xywhr and ``[m]``,
        in the same pixels."""
        boxes = torch.cat((detections[:, :4], detections[:, 6:7]), 1)
        tp = match_by_iou(probiou(gt_boxes.to(boxes), boxes), detections[:, 5], gt_cls.to(detections.device),
                          self.iou_thresholds.to(detections.device), self.rules.greedy_matching)
        self._add(tp, detections, gt_cls)
