"""The anchor-free keypoint (pose) loss (YOLOv8-pose, YOLO11-pose, YOLOv5u-pose): the anchor-free detection terms
on the task-aligned assignment, plus a keypoint location term and, for keypoints with a visibility value, a
visibility term.

Semantics follow ultralytics' ``v8PoseLoss`` and ``KeypointLoss`` (``utils/loss.py``). Each foreground anchor point
predicts its target's keypoints as offsets from the cell, in strides: ``2 * raw + cell index`` (the point less half
a stride). The location term is an OKS-like error per keypoint, ``1 - exp(-d² / (8 σ² (area + 1e-9)))`` with ``d``
the distance and ``area`` the target box's, both in strides (COCO evaluation's scale: (2σ)² × 2 × area), counted at
the labelled keypoints only (visibility not 0), each target's terms scaled by K over its labelled count, averaged
over foreground points and keypoints. The visibility term is the BCE of the predicted visibility logits against
"labelled", averaged alike. A target whose keypoints carry no visibility (D == 2) has all of them labelled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..settings import from_mapping, setting
from .anchor_free import POINT_OFFSET, AnchorFreeLoss, AnchorFreeLossConfig, Predictions, padded_targets
from .assign import Assignment
from .detect import TargetsLike

# COCO's per-keypoint OKS constants (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles), the sigmas of
# COCO keypoint evaluation.
COCO_KEYPOINT_SIGMAS: tuple[float, ...] = tuple(s / 10.0 for s in (
    0.26, 0.25, 0.25, 0.35, 0.35, 0.79, 0.79, 0.72, 0.72, 0.62, 0.62, 1.07, 1.07, 0.87, 0.87, 0.89, 0.89))
# The keypoint shape whose loss uses COCO's sigmas (others: 1/K each), as the reference decides it.
COCO_SIGMAS_SHAPE = (17, 3)
# The reference's margins of the keypoint term's divisions.
KEYPOINT_EPS = 1e-9


@dataclasses.dataclass(frozen=True)
class AnchorFreePoseLossConfig(AnchorFreeLossConfig):
    """The detection loss's settings and the keypoint terms' gains; ultralytics' defaults (``cfg/default.yaml``)."""

    pose: float = setting(12.0, "keypoint location loss gain", min=0)
    kobj: float = setting(1.0, "keypoint visibility loss gain", min=0)


def keypoint_sigmas(kpt_shape: Sequence[int]) -> torch.Tensor:
    """The per-keypoint sigmas of the loss for ``kpt_shape``: COCO's for COCO's 17 keypoints with visibility,
    else 1/K each (the reference's choice)."""
    keypoints = int(kpt_shape[0])
    if tuple(int(v) for v in kpt_shape) == COCO_SIGMAS_SHAPE:
        return torch.tensor(COCO_KEYPOINT_SIGMAS)
    return torch.full((keypoints,), 1.0 / keypoints)


class AnchorFreePoseLoss(AnchorFreeLoss):
    """``criterion(maps, targets, keypoints, pred_size=imgs.shape[2:4])`` → scalar loss.

    ``maps`` are a pose model's train-mode head maps, one ``[B, 4 * reg_max + nc + K*D, H, W]`` per level (the
    keypoints last, keypoint-major). ``targets`` are the ``[N, 6]`` detection targets and ``keypoints`` their
    ``[N, K, D']`` keypoints, row for row: x, y normalised to the network input and, with ``D' == 3``, the label's
    visibility (0: not labelled; 1, 2: labelled). ``sigmas`` (K positive values) replaces the per-keypoint sigmas
    (:func:`keypoint_sigmas`). The total is (box + pose + kobj + cls + dfl) × batch size; ``self.components`` holds
    the five detached parts in that order, ultralytics' order.
    """

    component_names = ("box", "pose", "kobj", "cls", "dfl")

    def __init__(self, model: nn.Module, rect_training: bool = False, img_size: int | None = None,
                 hyp: AnchorFreeLossConfig | Mapping[str, float] | None = None,
                 sigmas: Sequence[float] | torch.Tensor | None = None) -> None:
        if isinstance(hyp, AnchorFreeLossConfig) and not isinstance(hyp, AnchorFreePoseLossConfig):
            hyp = dataclasses.asdict(hyp)  # the detection settings, the keypoint gains at their defaults
        hyp = hyp if isinstance(hyp, AnchorFreePoseLossConfig) else from_mapping(AnchorFreePoseLossConfig, hyp or {})
        super().__init__(model, rect_training, img_size, hyp)
        head = getattr(model, "module", model).head
        kpt_shape = getattr(head, "kpt_shape", None)
        if kpt_shape is None:
            raise ValueError("the pose loss needs a head that predicts keypoints (a kpt_shape)")
        self.kpt_shape = (int(kpt_shape[0]), int(kpt_shape[1]))
        sigmas = keypoint_sigmas(self.kpt_shape) if sigmas is None else torch.as_tensor(sigmas, dtype=torch.float32)
        sigmas = sigmas.flatten()
        if sigmas.numel() != self.kpt_shape[0] or not bool((sigmas > 0).all()):
            raise ValueError(f"sigmas must be {self.kpt_shape[0]} positive values, got {sigmas.tolist()}")
        self.sigmas = sigmas

    def __call__(self, outputs: Sequence[torch.Tensor], targets: TargetsLike,
                 keypoints: torch.Tensor | None = None, pred_size: Sequence[int] | None = None) -> torch.Tensor:
        if keypoints is None:
            raise ValueError("the pose loss needs the target keypoints [N, K, D]")
        maps, targets = self._prepare(outputs, targets, pred_size)
        keypoints = self._check_keypoints(keypoints, targets, maps[0])
        batch_size = maps[0].shape[0]
        predictions = Predictions(maps, self.strides, self.reg_max, self.nc)
        padded = padded_targets(targets, batch_size, predictions.pixels)
        lbox, lcls, ldfl, assignment = self._detection_losses(predictions, padded)
        lpose, lkobj = self._keypoint_losses(predictions, assignment, padded.rows, keypoints)
        lpose, lkobj = lpose * self.hyp.pose, lkobj * self.hyp.kobj
        self.components = torch.stack((lbox, lpose, lkobj, lcls, ldfl)).detach()
        total = (lbox + lpose + lkobj + lcls + ldfl) * batch_size
        if torch.is_grad_enabled():
            self._check_diverged(total, maps)
        return total

    def _extra_channels(self) -> tuple[int, str]:
        keypoints, dimensions = self.kpt_shape
        return keypoints * dimensions, f"keypoint values ({keypoints} x {dimensions})"

    def _check_keypoints(self, keypoints: torch.Tensor, targets: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """The keypoints as a ``[N, K, D']`` tensor of the maps' dtype and device (a copy where it must convert)."""
        keypoints = torch.as_tensor(keypoints).to(device=like.device, dtype=like.dtype)
        count = self.kpt_shape[0]
        if keypoints.ndim != 3 or keypoints.shape[:2] != (targets.shape[0], count) or keypoints.shape[2] not in (2, 3):
            raise ValueError(f"keypoints of shape {tuple(keypoints.shape)} do not match [{targets.shape[0]} targets, "
                             f"{count} keypoints, 2 or 3 values]")
        if not torch.isfinite(keypoints).all():
            raise ValueError("keypoints contain NaN or infinite values")
        return keypoints

    def _keypoint_losses(self, predictions: Predictions, assignment: Assignment, rows: torch.Tensor,
                         keypoints: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The location and visibility terms, before their gains."""
        raw = predictions.coefficients                                                          # [B, A, K*D]
        image, point = assignment.foreground.nonzero(as_tuple=True)
        if not image.numel():
            # Nothing to compare: the keypoint outputs stay in the graph with zero gradients, so that
            # DistributedDataParallel finds every parameter used.
            return (raw * 0).sum(), raw.new_zeros(())
        count, dimensions = self.kpt_shape
        stride = predictions.strides[point]                                                     # [n, 1]
        target = keypoints[rows[image, assignment.target_index[image, point]]]                  # [n, K, D']
        target_xy = target[..., :2] * predictions.pixels[:2] / stride[:, None]                  # in strides
        labelled = target[..., 2] != 0 if target.shape[-1] == 3 else torch.ones_like(target[..., 0], dtype=torch.bool)
        predicted = raw[image, point].reshape(-1, count, dimensions)
        predicted_xy = predicted[..., :2] * 2.0 + (predictions.points[point] - POINT_OFFSET)[:, None]
        box = assignment.boxes[image, point] / stride                                           # xyxy, in strides
        area = ((box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1]))[:, None]
        distance_sq = (predicted_xy - target_xy).pow(2).sum(-1)                                 # [n, K]
        sigmas = self.sigmas.to(device=raw.device, dtype=raw.dtype)
        error = distance_sq / ((2 * sigmas).pow(2) * (area + KEYPOINT_EPS) * 2)
        scale = count / (labelled.sum(1, keepdim=True) + KEYPOINT_EPS)
        location = (scale * (1 - torch.exp(-error)) * labelled).mean()
        if dimensions < 3:
            return location, raw.new_zeros(())
        visibility = F.binary_cross_entropy_with_logits(predicted[..., 2], labelled.to(raw.dtype))
        return location, visibility
