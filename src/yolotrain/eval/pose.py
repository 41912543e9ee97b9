"""Scoring keypoints: object keypoint similarity (OKS, COCO's) and :class:`PoseStats`, box results plus keypoint
results matched by OKS."""

from __future__ import annotations

import torch

from .metrics import IOU_THRESHOLDS, ULTRALYTICS_SCORING, DetectionStats, Metrics, ScoringRules, match_by_iou

# COCO's per-keypoint OKS scales of its 17 person keypoints (nose, eyes, ears, shoulders, elbows, wrists, hips,
# knees, ankles), float32 as the reference keeps them.
COCO_KEYPOINT_SIGMAS = torch.tensor([0.26, 0.25, 0.25, 0.35, 0.35, 0.79, 0.79, 0.72, 0.72, 0.62, 0.62, 1.07, 1.07,
                                     0.87, 0.87, 0.89, 0.89]) / 10.0
# COCO (and the reference) take a label's area as this share of its box's: a person fills about half of it.
BOX_AREA_SHARE = 0.53


def oks_sigmas(num_keypoints: int, dims: int) -> torch.Tensor:
    """The reference's OKS scales when the dataset names none: COCO's for its keypoint shape (17 keypoints with
    visibility), else ``1 / num_keypoints`` for every keypoint."""
    if (num_keypoints, dims) == (17, 3):
        return COCO_KEYPOINT_SIGMAS.clone()
    return torch.full((num_keypoints,), 1.0 / num_keypoints, dtype=torch.float64)


def keypoint_oks(gt_keypoints: torch.Tensor, pred_keypoints: torch.Tensor, areas: torch.Tensor,
                 sigmas: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Object keypoint similarity ``[m, n]`` of labels ``[m, K, D]`` and predictions ``[n, K, 2 or 3]`` (x, y in
    the same pixels; a prediction's visibility is not used), ``areas [m]`` the labels' object areas, ``sigmas
    [K]`` the keypoints' scales.

    The mean over a label's labelled keypoints (visibility not 0; all of them when ``D`` is 2) of
    ``exp(-d² / (2 area (2 sigma)²))``, ``d`` the keypoint's distance to the prediction's (COCOeval's).
    """
    dx = gt_keypoints[:, None, :, 0] - pred_keypoints[None, :, :, 0]
    dy = gt_keypoints[:, None, :, 1] - pred_keypoints[None, :, :, 1]
    squared = dx.pow(2) + dy.pow(2)  # [m, n, K]
    scales = sigmas.to(gt_keypoints)
    exponent = squared / ((2 * scales).pow(2) * (areas[:, None, None] + eps) * 2)
    if gt_keypoints.shape[-1] > 2:
        labelled = gt_keypoints[..., 2] != 0
    else:
        labelled = gt_keypoints.new_ones(gt_keypoints.shape[:2], dtype=torch.bool)
    return ((-exponent).exp() * labelled[:, None]).sum(-1) / (labelled.sum(-1)[:, None] + eps)


class PoseStats(DetectionStats):
    """:class:`DetectionStats` of boxes plus the same matching and AP over keypoint OKS; ``compute`` gives the box
    :class:`Metrics` with the keypoint ones in its ``keypoints``. Ultralytics' scoring rules unless told
    otherwise, since its models are the published pose ones."""

    def __init__(self, nc: int, sigmas: torch.Tensor, iou_thresholds: torch.Tensor = IOU_THRESHOLDS,
                 rules: ScoringRules = ULTRALYTICS_SCORING) -> None:
        super().__init__(nc, iou_thresholds, rules)
        self.sigmas = sigmas
        self._keypoint_tp: list[torch.Tensor] = []

    def update_keypoints(self, detections: torch.Tensor, gt_boxes: torch.Tensor, gt_cls: torch.Tensor,
                         pred_keypoints: torch.Tensor, gt_keypoints: torch.Tensor) -> None:
        """Add one image: as :meth:`DetectionStats.update` (labels ``[m, 4]`` xyxy), with the detections' keypoints
        ``[n, K, 2 or 3]`` and the labels' ``[m, K, D]``, in the same pixels as the boxes."""
        self.update(detections, gt_boxes, gt_cls)
        areas = (gt_boxes[:, 2] - gt_boxes[:, 0]) * (gt_boxes[:, 3] - gt_boxes[:, 1]) * BOX_AREA_SHARE
        oks = keypoint_oks(gt_keypoints, pred_keypoints, areas, self.sigmas)
        tp = match_by_iou(oks, detections[:, 5], gt_cls.to(detections.device),
                          self.iou_thresholds.to(detections.device), self.rules.greedy_matching)
        self._keypoint_tp.append(tp.cpu())

    def compute(self, names: list[str]) -> Metrics:
        metrics = self._metrics(self._tp, names)
        metrics.keypoints = self._metrics(self._keypoint_tp, names)
        return metrics
