"""Boxes drawn onto images (OpenCV, no fonts needed): detections in prediction and validation
pictures, ground truth in dataset previews. One colour per class everywhere."""

from __future__ import annotations

import colorsys
from collections.abc import Sequence

import cv2
import numpy as np
import torch


def class_colour(index: int) -> tuple[int, int, int]:
    """A stable, saturated BGR colour per class: hues spaced by the golden angle so neighbours differ."""
    r, g, b = colorsys.hsv_to_rgb((index * 0.618033988749895) % 1.0, 0.85, 0.95)
    return int(b * 255), int(g * 255), int(r * 255)


def draw_detections(image: np.ndarray, boxes: torch.Tensor | np.ndarray, classes: torch.Tensor | np.ndarray,
                    names: Sequence[str], scores: torch.Tensor | np.ndarray | None = None, *,
                    line_width: int | None = None, hide_labels: bool = False, hide_conf: bool = False) -> np.ndarray:
    """A copy of the BGR ``image`` with each xyxy pixel box and its class name (and score, when given)
    drawn on it.

    Line width (unless ``line_width`` pixels are asked for) and text size scale with the image; labels
    sit above the box (inside it at the top edge) on a filled background in the class colour, with
    black or white text for contrast. ``hide_labels`` draws the boxes alone, ``hide_conf`` the class
    names without scores.
    """
    if line_width is not None and line_width < 1:
        raise ValueError(f"line_width must be at least 1 pixel, got {line_width}")
    out = np.ascontiguousarray(image).copy()
    h, w = out.shape[:2]
    thickness = line_width or max(round((h + w) / 2 * 0.003), 2)
    font_scale = thickness / 3
    font_thickness = max(thickness - 1, 1)
    boxes = torch.as_tensor(boxes, dtype=torch.float64).reshape(-1, 4).round().int().tolist()
    classes = torch.as_tensor(classes).reshape(-1).int().tolist()
    texts = [f"{names[c] if 0 <= c < len(names) else c}" for c in classes]
    if scores is not None and not hide_conf:
        texts = [f"{t} {s:.2f}" for t, s in zip(texts, torch.as_tensor(scores).reshape(-1).tolist())]
    for (x1, y1, x2, y2), c, label in zip(boxes, classes, texts):
        colour = class_colour(c)
        cv2.rectangle(out, (x1, y1), (x2, y2), colour, thickness, cv2.LINE_AA)
        if hide_labels:
            continue
        (tw, th), baseline = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, font_scale, font_thickness)
        above = y1 - th - baseline - 3 >= 0
        top = y1 - th - baseline - 3 if above else y1
        cv2.rectangle(out, (x1, top), (x1 + tw + 2, top + th + baseline + 3), colour, -1, cv2.LINE_AA)
        text_colour = (0, 0, 0) if sum(colour) > 382 else (255, 255, 255)
        cv2.putText(out, label, (x1 + 1, top + th + 1), cv2.FONT_HERSHEY_SIMPLEX, font_scale, text_colour,
                    font_thickness, cv2.LINE_AA)
    return out


def draw_masks(image: np.ndarray, masks: np.ndarray, classes: torch.Tensor | np.ndarray,
               alpha: float = 0.5) -> np.ndarray:
    """A copy of the BGR ``image`` with each bool mask ``[n, h, w]`` (the image's size) blended in its
    class colour; later masks lie over earlier ones."""
    out = image.copy()
    for mask, c in zip(np.asarray(masks, bool), np.asarray(classes).astype(int).tolist()):
        colour = np.array(class_colour(c), np.float32)
        out[mask] = (out[mask] * (1 - alpha) + colour * alpha).astype(np.uint8)
    return out
