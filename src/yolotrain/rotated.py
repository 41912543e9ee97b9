"""Rotated-box geometry: corner points ↔ (cx, cy, w, h, angle) and probabilistic IoU (ProbIoU).

A rotated box is ``(cx, cy, w, h, r)`` ("xywhr") with ``r`` in radians: the ``w`` side points along
``(cos r, sin r)`` in pixel coordinates (y down), the ``h`` side along ``(-sin r, cos r)``. Boxes read from
corner points are canonical, as the reference's: ``w`` is the longer side and ``r`` lies in
``[-pi/4, 3pi/4)``.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import torch


def corners_to_xywhr(corners: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """The minimum-area rectangles around ``(n, 2P)`` or ``(n, P, 2)`` points (four corners, or any polygon)
    as canonical ``(n, 5)`` xywhr.

    NumPy input gives float64, a tensor gives its own dtype and device. OpenCV's ``minAreaRect`` (on float32
    points, as the reference) finds each rectangle: where several rectangles share the least area (points
    whose hull is a triangle, a corner cut off by the image border), which one it returns is its own rule,
    so the reference's labels are kept exactly.
    """
    is_tensor = isinstance(corners, torch.Tensor)
    points = np.asarray(corners.detach().cpu() if is_tensor else corners, dtype=np.float32)
    rectangles = [cv2.minAreaRect(polygon.reshape(-1, 2)) for polygon in points]
    boxes = np.array([(cx, cy, w, h, math.radians(degrees)) for (cx, cy), (w, h), degrees in rectangles],
                     dtype=np.float64).reshape(-1, 5)
    longer_across = boxes[:, 2] < boxes[:, 3]
    boxes[:, 2:4] = np.where(longer_across[:, None], boxes[:, 3:1:-1], boxes[:, 2:4])
    angle = np.where(longer_across, boxes[:, 4] + math.pi / 2, boxes[:, 4])
    boxes[:, 4] = np.remainder(angle + math.pi / 4, math.pi) - math.pi / 4
    return torch.as_tensor(boxes, dtype=corners.dtype, device=corners.device) if is_tensor else boxes


def xywhr_to_corners(boxes: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """``(..., 5)`` xywhr → ``(..., 4, 2)`` corner points, in the reference's order (centre + w side + h side
    first, then clockwise on screen). The angle is used as given, not canonicalised."""
    is_tensor = isinstance(boxes, torch.Tensor)
    cos, sin = (torch.cos, torch.sin) if is_tensor else (np.cos, np.sin)
    cat, stack = (torch.cat, torch.stack) if is_tensor else (np.concatenate, np.stack)
    centre = boxes[..., :2]
    w, h, angle = boxes[..., 2:3], boxes[..., 3:4], boxes[..., 4:5]
    cos_angle, sin_angle = cos(angle), sin(angle)
    half_w = cat((w / 2 * cos_angle, w / 2 * sin_angle), -1)
    half_h = cat((-h / 2 * sin_angle, h / 2 * cos_angle), -1)
    return stack((centre + half_w + half_h, centre + half_w - half_h,
                  centre - half_w - half_h, centre - half_w + half_h), -2)


def regularize_xywhr(boxes: torch.Tensor) -> torch.Tensor:
    """``(..., 5)`` xywhr with the angle brought into ``[0, pi/2)``, w and h swapped where the angle moved by
    an odd multiple of pi/2 (the same rectangle)."""
    x, y, w, h, angle = boxes.unbind(-1)
    swap = torch.remainder(angle, math.pi) >= math.pi / 2
    return torch.stack((x, y, torch.where(swap, h, w), torch.where(swap, w, h),
                        torch.remainder(angle, math.pi / 2)), -1)


def _covariance(boxes: torch.Tensor, floor: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The covariance ``[[a, c], [c, b]]`` of the uniform distribution over each ``(..., 5)`` box (variance of a
    side s is s²/12, plus ``floor``), rotated by its angle; each ``(...)``."""
    var_w = boxes[..., 2].pow(2) / 12 + floor
    var_h = boxes[..., 3].pow(2) / 12 + floor
    cos, sin = boxes[..., 4].cos(), boxes[..., 4].sin()
    cos2, sin2 = cos.pow(2), sin.pow(2)
    return var_w * cos2 + var_h * sin2, var_w * sin2 + var_h * cos2, (var_w - var_h) * cos * sin


def probiou_pairs(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-7, floor: float = 0.0) -> torch.Tensor:
    """ProbIoU (Llerena et al., 2021) of xywhr boxes ``(..., 5)`` taken in pairs (shapes broadcast): 1 minus
    the Hellinger distance between the boxes' Gaussians, the Bhattacharyya distance clamped to
    ``[eps, 100]``; shape ``(...)``.

    Out of place throughout, so the loss can back-propagate through it. ``floor`` adds to each side's
    variance, bounding the gradient of boxes smaller than a stride (the reference's loss uses 0.01).
    """
    x1, y1 = boxes1[..., 0], boxes1[..., 1]
    x2, y2 = boxes2[..., 0], boxes2[..., 1]
    a1, b1, c1 = _covariance(boxes1, floor)
    a2, b2, c2 = _covariance(boxes2, floor)
    a, b, c = a1 + a2, b1 + b2, c1 + c2
    determinant = a * b - c.pow(2)
    t1 = (a * (y1 - y2).pow(2) + b * (x1 - x2).pow(2)) / (determinant + eps) * 0.25
    t2 = (c * (x2 - x1) * (y1 - y2)) / (determinant + eps) * 0.5
    own_determinants = (a1 * b1 - c1.pow(2)).clamp(min=0) * (a2 * b2 - c2.pow(2)).clamp(min=0)
    t3 = (determinant / (4 * own_determinants.sqrt() + eps) + eps).log() * 0.5
    bhattacharyya = (t1 + t2 + t3).clamp(eps, 100.0)
    hellinger = (1.0 - (-bhattacharyya).exp() + eps).sqrt()
    return 1 - hellinger


def probiou(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Pairwise ProbIoU of ``(N, 5)`` and ``(M, 5)`` xywhr boxes: ``(N, M)``."""
    return probiou_pairs(boxes1[:, None], boxes2[None], eps=eps)
