"""Pictures of rotated boxes: training and validation batches with their labels' or detections' corners."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch

from ...draw import draw_detections, tile_grid
from ...rotated import xywhr_to_corners


def draw_rotated_batch(imgs: torch.Tensor, rows: torch.Tensor, names: Sequence[str],
                       max_images: int = 16) -> np.ndarray:
    """One BGR picture of the first ``max_images`` of ``imgs [B, 3, H, W]`` (RGB, uint8 or floats in 0..1) in a
    square grid, each with the rotated boxes of its ``rows`` (image, class, cx, cy, w, h normalised to the
    batch, angle in radians, and a detection's score when there is an eighth column) drawn as polygons."""
    n = min(imgs.shape[0], max_images)
    pixels = imgs[:n].detach().float().cpu() * (255 if imgs.is_floating_point() else 1)
    pixels = pixels.clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
    rows = rows.detach().double().cpu()
    h, w = pixels.shape[1:3]
    scale = torch.tensor([w, h, w, h], dtype=torch.float64)
    tiles = []
    for i in range(n):
        own = rows[rows[:, 0] == i]
        xywhr = torch.cat((own[:, 2:6] * scale, own[:, 6:7]), 1)
        corners = xywhr_to_corners(xywhr)
        bounds = torch.cat((corners.amin(1), corners.amax(1)), 1)
        image = cv2.cvtColor(pixels[i], cv2.COLOR_RGB2BGR)
        tiles.append(draw_detections(image, bounds, own[:, 1], names, own[:, 7] if own.shape[1] > 7 else None,
                                     outlines=list(corners.numpy())))
    return tile_grid(tiles)
