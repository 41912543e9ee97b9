"""Boxes drawn onto images (OpenCV, no fonts needed): detections in prediction and validation
pictures, ground truth in dataset previews and training batches. One colour per class everywhere."""

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
                    line_width: int | None = None, hide_labels: bool = False, hide_conf: bool = False,
                    outlines: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """A copy of the BGR ``image`` with each xyxy pixel box and its class name (and score, when given)
    drawn on it; with ``outlines`` (each box's polygon, ``(k, 2)`` x, y pixels: a rotated box's corners) the
    polygons are drawn instead of the boxes, whose top-left corner still places the label.

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
    for k, ((x1, y1, x2, y2), c, label) in enumerate(zip(boxes, classes, texts)):
        colour = class_colour(c)
        if outlines is None:
            cv2.rectangle(out, (x1, y1), (x2, y2), colour, thickness, cv2.LINE_AA)
        else:
            points = np.round(np.asarray(outlines[k], np.float64)).astype(np.int32).reshape(-1, 1, 2)
            cv2.polylines(out, [points], True, colour, thickness, cv2.LINE_AA)
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


# COCO's person skeleton: the pairs of its 17 keypoints (0-based) joined by a line, and each limb's colour.
COCO_SKELETON = ((15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8), (7, 9),
                 (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6))
# A keypoint with a visibility below this is not drawn (nor its limbs), as ultralytics' plots skip them.
KEYPOINT_CONF = 0.5


def draw_keypoints(image: np.ndarray, keypoints: np.ndarray | torch.Tensor, *, radius: int | None = None,
                   conf: float = KEYPOINT_CONF) -> np.ndarray:
    """A copy of the BGR ``image`` with keypoints ``[n, K, D]`` (x, y pixels, D == 3: visibility, those below
    ``conf`` left out) drawn as dots in their keypoint's colour, joined by COCO's skeleton when ``K`` is COCO's
    17 (other layouts have no known skeleton: points only)."""
    out = np.ascontiguousarray(image).copy()
    points = np.asarray(keypoints, dtype=np.float64)
    h, w = out.shape[:2]
    radius = radius or max(round((h + w) / 2 * 0.004), 2)
    shown = (points[..., 0] >= 0) & (points[..., 0] < w) & (points[..., 1] >= 0) & (points[..., 1] < h)
    if points.shape[-1] == 3:
        shown &= points[..., 2] >= conf
    xy = points[..., :2].round().astype(int)
    skeleton = COCO_SKELETON if points.shape[1] == 17 else ()
    for person, visible in zip(xy, shown):
        for limb, (a, b) in enumerate(skeleton):
            if visible[a] and visible[b]:
                cv2.line(out, tuple(person[a].tolist()), tuple(person[b].tolist()), class_colour(limb),
                         max(radius // 2, 1), cv2.LINE_AA)
        for k, ((x, y), seen) in enumerate(zip(person.tolist(), visible)):
            if seen:
                cv2.circle(out, (x, y), radius, class_colour(k), -1, cv2.LINE_AA)
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


def object_masks(masks: np.ndarray, n: int, shape: tuple[int, int], overlap: bool) -> np.ndarray:
    """Bool ``[n, h, w]`` masks at the image's ``shape`` (h, w) from a sample's target masks at 1/mask_ratio;
    row ``k`` of an overlap map is the pixels numbered ``k + 1``, as the loss reads them."""
    per_object = masks[0] == np.arange(1, n + 1)[:, None, None] if overlap else masks.astype(bool)
    resized = [cv2.resize(m.astype(np.uint8), shape[::-1], interpolation=cv2.INTER_NEAREST) for m in per_object]
    return np.stack(resized).astype(bool) if n else np.zeros((0, *shape), bool)


def draw_batch(imgs: torch.Tensor, targets: torch.Tensor, names: Sequence[str], masks: torch.Tensor | None = None,
               overlap: bool = True, max_images: int = 16, keypoints: torch.Tensor | None = None) -> np.ndarray:
    """One BGR picture of a training batch (the reference's ``train_batch*.jpg``): the first ``max_images``
    of ``imgs [B, 3, H, W]`` (RGB, uint8 or floats in 0..1) in a square grid, each with the boxes and class
    names of its ``targets`` rows (image, class, cx, cy, w, h normalised, and a detection's score when there
    is a seventh column) and, for a segmentation batch,
    its target ``masks`` (``overlap``: one ``[B, h, w]`` numbered map per image, else ``[N, h, w]`` per
    target row) blended in their class colours; for a pose batch, its rows' ``keypoints`` ``[N, K, D]`` (x, y
    normalised, D == 3: visibility) drawn over the boxes (:func:`draw_keypoints`)."""
    n = min(imgs.shape[0], max_images)
    pixels = imgs[:n].detach().float().cpu() * (255 if imgs.is_floating_point() else 1)
    pixels = pixels.clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
    targets = targets.detach().cpu()
    h, w = pixels.shape[1:3]
    tiles = []
    for i in range(n):
        rows = targets[:, 0] == i
        labels = targets[rows, 1:].double()
        image = cv2.cvtColor(pixels[i], cv2.COLOR_RGB2BGR)
        if masks is not None:
            own = (masks[i:i + 1] if overlap else masks[rows]).detach().cpu().numpy()
            image = draw_masks(image, object_masks(own, len(labels), (h, w), overlap), labels[:, 0])
        centres, sizes = labels[:, 1:3], labels[:, 3:5]
        scale = torch.tensor([w, h, w, h], dtype=torch.float64)
        boxes = torch.cat((centres - sizes / 2, centres + sizes / 2), 1) * scale
        image = draw_detections(image, boxes, labels[:, 0], names, labels[:, 5] if labels.shape[1] > 5 else None)
        if keypoints is not None:
            points = keypoints[rows].detach().double().cpu().clone()
            points[..., 0] *= w
            points[..., 1] *= h
            image = draw_keypoints(image, points.numpy())
        tiles.append(image)
    return tile_grid(tiles)


def tile_grid(tiles: Sequence[np.ndarray]) -> np.ndarray:
    """Pictures of one size in a square grid, row by row, the grid's empty places grey."""
    n = len(tiles)
    cols = int(np.ceil(np.sqrt(n)))
    grid_rows = -(-n // cols)
    tiles = [*tiles, *[np.full_like(tiles[0], 114)] * (grid_rows * cols - n)]
    return np.vstack([np.hstack(tiles[r * cols:(r + 1) * cols]) for r in range(grid_rows)])
