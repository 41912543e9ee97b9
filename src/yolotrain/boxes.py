"""Box conversions and IoU variants. Boxes are ``(..., 4)`` tensors; pairwise IoU lives in torchvision."""

from __future__ import annotations

import math

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
