"""Box conversions, IoU variants and letterbox geometry. Boxes are ``(..., 4)`` tensors; pairwise IoU
lives in torchvision."""

from __future__ import annotations

import math

import numpy as np
import torch


def xywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """(cx, cy, w, h) → (x1, y1, x2, y2)."""
    xy, wh = boxes[..., :2], boxes[..., 2:4]
    return torch.cat((xy - wh / 2, xy + wh / 2), -1)


def xyxy_to_xywh(boxes: torch.Tensor) -> torch.Tensor:
    """(x1, y1, x2, y2) → (cx, cy, w, h)."""
    x1y1, x2y2 = boxes[..., :2], boxes[..., 2:4]
    return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), -1)


def complete_iou(box1: torch.Tensor, box2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Element-wise Complete IoU (Zheng et al., 2020) of aligned (cx, cy, w, h) boxes; shape ``(...)``.

    CIoU = IoU - centre distance² / enclosing diagonal² - α·v, where v measures the aspect-ratio
    mismatch and α is treated as a constant in the gradient, as in the paper and the reference.
    """
    x1, y1, w1, h1 = box1.unbind(-1)
    x2, y2, w2, h2 = box2.unbind(-1)
    b1_x1, b1_x2, b1_y1, b1_y2 = x1 - w1 / 2, x1 + w1 / 2, y1 - h1 / 2, y1 + h1 / 2
    b2_x1, b2_x2, b2_y1, b2_y2 = x2 - w2 / 2, x2 + w2 / 2, y2 - h2 / 2, y2 + h2 / 2

    inter = ((b1_x2.minimum(b2_x2) - b1_x1.maximum(b2_x1)).clamp(min=0)
             * (b1_y2.minimum(b2_y2) - b1_y1.maximum(b2_y1)).clamp(min=0))
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union

    enclosing_w = b1_x2.maximum(b2_x2) - b1_x1.minimum(b2_x1)
    enclosing_h = b1_y2.maximum(b2_y2) - b1_y1.minimum(b2_y1)
    diagonal_sq = enclosing_w**2 + enclosing_h**2 + eps
    centre_dist_sq = ((b2_x1 + b2_x2 - b1_x1 - b1_x2) ** 2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2) ** 2) / 4
    # Heights are floored at eps: a collapsed prediction (h = 0) must not turn the gradient into NaN.
    v = (4 / math.pi**2) * (torch.atan(w2 / h2.clamp(min=eps)) - torch.atan(w1 / h1.clamp(min=eps))).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (centre_dist_sq / diagonal_sq + v * alpha)


def letterbox_geometry(
    size_wh: np.ndarray, target_wh: np.ndarray, scaleup: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where images of ``size_wh`` land when letterboxed into ``target_wh``: the one rule used by the
    data pipeline, prediction and validation.

    The image is scaled by ``r = min(target / size)`` (capped at 1 without ``scaleup``), its sides
    rounded to whole pixels (at least 1, for extreme aspect ratios), and centred; an odd border pixel
    goes to the bottom/right, as in the reference. Works on ``(2,)`` or ``(n, 2)`` arrays of (w, h).

    Returns:
        ``r`` (``(..., 1)``), the resized (w, h) in whole pixels and the (left, top) padding, so that
        ``x_input = x_original * resized / size + pad``.
    """
    size = np.asarray(size_wh, dtype=np.float64)
    target = np.asarray(target_wh, dtype=np.float64)
    r = (target / size).min(-1, keepdims=True)
    if not scaleup:  # never enlarge for evaluation: it only blurs and skews the metric
        r = np.minimum(r, 1.0)
    # At least a pixel a side: a 2001 x 3 image fitted into 320 would round its height to 0.
    resized = np.maximum(np.round(size * r), 1)
    pad = np.round((target - resized) / 2 - 0.1)
    return r, resized, pad


# Largest network input side: class-aware NMS keeps classes apart by shifting boxes 7680 pixels per
# class (nms.MAX_WH), and one 3-channel input of this side is already 700 MB in float32.
MAX_IMG_SIZE = 7680


def check_image_size(size: int, stride: int = 32, name: str = "img_size") -> int:
    """``size`` when it is a positive multiple of the model's largest ``stride`` up to :data:`MAX_IMG_SIZE`;
    else ``ValueError``."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0 or size % stride:
        raise ValueError(f"{name} must be a positive multiple of {stride}, got {size!r}")
    if size > MAX_IMG_SIZE:
        raise ValueError(f"{name} must be at most {MAX_IMG_SIZE}, got {size}")
    return size
