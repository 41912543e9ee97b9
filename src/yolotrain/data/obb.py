"""The oriented-box dataset: DOTA-style rows ``class x1 y1 x2 y2 x3 y3 x4 y4`` (read by the polygon reader of
:mod:`.verify`), moved as polygons with the pixels and turned into rotated boxes at the end.

As Ultralytics' OBB data: the corners are placed by the mosaic and letterbox, warped by the random perspective
(rotation included) and flipped; a rectangle that crosses the image's edge becomes the rectangle of its own
orientation around its visible part; the rows whose visible part is too small (the box filter of
:func:`~yolotrain.data.augment.box_candidates` at 1% of their former area, as for polygons) are dropped; each
polygon's minimum-area rectangle (:func:`~yolotrain.rotated.corners_to_xywhr`) is the row's box, and augmented
rows whose box is 2 pixels across or less are dropped too. A label row of another polygon is read the same way,
and a box-only row as its axis-aligned rectangle.

Polygons travel as ``(n, P, 2)`` pixel arrays: polygons with fewer points repeat their last one, which changes
neither their hull nor their rectangle. Warps map lines to lines, so moving the corners moves the rectangle.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch

from ..rotated import corners_to_xywhr
from . import augment as A
from .batch import Batch
from .dataset import BatchBuffers, DetectionDataset, SampleKey
from .verify import LabelIndex

# Rows whose visible part keeps less than this share of their former box area are dropped (the polygon rule).
MIN_AREA_SHARE = 0.01
# Augmented rows whose rotated box is this many pixels across or less are dropped: the box filter's rule
# (a thin box turned 45 degrees has a large axis-aligned box).
MIN_SIDE = 2


class OBBDataset(DetectionDataset):
    """Items are ``(image HWC uint8 RGB, rows (n, 6))``, a row ``class, cx, cy, w, h, angle``: the rotated box in
    pixels of the item's image over its width (cx, w) and height (cy, h), as Ultralytics normalises it, the angle
    in radians in ``[-pi/4, 3pi/4)`` with w the longer side; :meth:`collate` gives a
    :class:`~yolotrain.data.batch.Batch` of ``targets`` ``[N, 7]``. Arguments as :class:`DetectionDataset`."""

    def __init__(self, index: LabelIndex, *args, **kwargs) -> None:
        super().__init__(index, *args, **kwargs)
        self.polygons: list[np.ndarray] = [
            row_polygons(index.labels[i], index.segments[i]) for i in self.order]

    def _placed(self, index: int, size: tuple[int, int], offset: tuple[float, float]) -> np.ndarray:
        return self.polygons[index] * size + offset

    def _mosaic(self, index: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        picks = rng.permutation(np.concatenate([[index], rng.integers(0, len(self), 3)]))
        placements: list[tuple[int, int, int, int]] = []
        canvas, labels = A.mosaic4([(self.load_image(i), self.labels[i]) for i in picks], self.img_size, rng,
                                   placements=placements)
        polygons = join_polygons([self._placed(i, (w, h), (x, y)) for i, (w, h, x, y) in zip(picks, placements)])
        polygons, labels[:, 1:5] = clip_rectangles(polygons, canvas.shape[1], canvas.shape[0])
        seen = (labels[:, 3] > labels[:, 1]) & (labels[:, 4] > labels[:, 2])
        border = -self.img_size // 2
        return random_perspective_polygons(canvas, labels[seen], polygons[seen], rng, self.hyp,
                                           border=(border, border))

    @staticmethod
    def _joined(geometry: np.ndarray, other: np.ndarray) -> np.ndarray:
        return join_polygons([geometry, other])

    def _perspective(self, img: np.ndarray, labels: np.ndarray, geometry: np.ndarray,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return random_perspective_polygons(img, labels, geometry, rng, self.hyp)

    def __getitem__(self, key: int | SampleKey) -> tuple[np.ndarray, np.ndarray]:
        _, img, labels, polygons, rng, _ = self._compose(key)
        height, width = img.shape[:2]
        if self.augment:
            img = A.hsv_to_rgb(img, rng, self.hyp.hsv_h, self.hyp.hsv_s, self.hyp.hsv_v)
            img, polygons = random_flips(img, polygons, rng, self.hyp.flipud, self.hyp.fliplr)
        else:
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        boxes = corners_to_xywhr(polygons)
        keep = (boxes[:, 2:4] > MIN_SIDE).all(1) if self.augment else np.ones(len(boxes), bool)
        return img, rotated_rows(labels[keep, 0], boxes[keep], width, height)

    @staticmethod
    def collate(batch: Sequence[tuple[np.ndarray, np.ndarray]], uint8: bool = False,
                buffers: BatchBuffers | None = None) -> Batch:
        """``imgs`` as :meth:`DetectionDataset.collate` (``uint8``, ``buffers`` as there) and ``targets`` ``[N, 7]``
        = (image index, class, cx, cy, w, h, angle)."""
        imgs, targets = DetectionDataset.collate([(img, rows[:, :5]) for img, rows in batch], uint8, buffers)
        angles = torch.from_numpy(np.concatenate([rows[:, 5:6] for _, rows in batch]).astype(np.float32))
        return Batch(imgs, torch.cat((targets, angles), 1))


def row_polygons(labels: np.ndarray, segments: Sequence[np.ndarray]) -> np.ndarray:
    """An image's label rows as one ``(n, P, 2)`` array of normalised polygons: each row's polygon, or for a
    box-only row (class + normalised cxcywh) its box's 4 corners."""
    cx, cy, w, h = labels[:, 1:5].T
    box_corners = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy - h / 2, cx + w / 2, cy + h / 2,
                            cx - w / 2, cy + h / 2], 1).reshape(-1, 4, 2)
    return join_polygons([(p if len(p) else corners)[None] for p, corners in zip(segments, box_corners)])


def join_polygons(groups: Sequence[np.ndarray]) -> np.ndarray:
    """``(n_i, P_i, 2)`` polygon arrays as one ``(sum n_i, P, 2)`` float64 array of ``P = max(4, P_i)`` points
    a polygon (room for a rectangle's corners), the shorter polygons repeating their last point."""
    groups = [g for g in groups if len(g)]
    if not groups:
        return np.zeros((0, 4, 2))
    points = max(4, *(g.shape[1] for g in groups))
    return np.concatenate([np.concatenate((g, np.repeat(g[:, -1:], points - g.shape[1], 1)), 1) for g in groups]
                          ).astype(np.float64)


def clip_rectangles(polygons: np.ndarray, width: float, height: float) -> tuple[np.ndarray, np.ndarray]:
    """Pixel polygons ``(n, P, 2)`` cut to a ``width`` x ``height`` image keeping their orientation (Ultralytics'
    ``preserve_obb`` clip), and the xyxy ``(n, 4)`` of their visible parts.

    A polygon inside the image stays as it is. One that crosses the edge becomes the rectangle, aligned with its
    own minimum-area rectangle, around its visible part (the convex hull's intersection with the image), so a
    cut box keeps its angle; one wholly outside becomes zeros (an empty box, dropped by the box filter).
    """
    if not len(polygons):
        return polygons, np.zeros((0, 4))
    boxes = np.concatenate((polygons.min(1), polygons.max(1)), 1)
    inside = (boxes[:, :2] >= 0).all(1) & (boxes[:, 2] <= width) & (boxes[:, 3] <= height)
    if inside.all():
        return polygons, boxes
    polygons = polygons.copy()
    image = np.array([(0, 0), (width, 0), (width, height), (0, height)], np.float32)
    for i in np.flatnonzero(~inside):
        polygon = polygons[i].astype(np.float32)
        area, visible = cv2.intersectConvexConvex(cv2.convexHull(polygon), image)
        if visible is None or area <= 0:
            polygons[i], boxes[i] = 0, 0
            continue
        visible = visible.reshape(-1, 2).astype(np.float64)
        boxes[i] = (*visible.min(0), *visible.max(0))
        (_, _), (w, h), degrees = cv2.minAreaRect(polygon)
        angle = np.deg2rad(degrees + 90 if w < h else degrees)
        basis = np.array([(np.cos(angle), -np.sin(angle)), (np.sin(angle), np.cos(angle))])
        aligned = visible @ basis
        (u1, v1), (u2, v2) = aligned.min(0), aligned.max(0)
        corners = np.array([(u2, v2), (u2, v1), (u1, v1), (u1, v2)]) @ basis.T
        polygons[i, :4], polygons[i, 4:] = corners, corners[-1]
    return polygons, boxes


def random_perspective_polygons(
    im: np.ndarray, labels: np.ndarray, polygons: np.ndarray, rng: np.random.Generator, hyp: A.AugmentConfig,
    border: tuple[int, int] = (0, 0),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~yolotrain.data.augment.random_perspective` (the same draws) for oriented boxes as pixel polygons
    ``(n, P, 2)``: the polygons are warped and cut to the image by :func:`clip_rectangles`, each row's box becomes
    that of its visible part, and rows keeping under 1% of their former box area (scaled by the warp) are dropped."""
    im, M, s, perspective = A.random_warp(im, rng, hyp, border)
    height, width = im.shape[:2]
    polygons, boxes = clip_rectangles(A.warp_points(polygons, M, perspective), width, height)
    keep = A.box_candidates(labels[:, 1:5].T * s, boxes.T, area_thr=MIN_AREA_SHARE)
    labels = labels[keep]
    labels[:, 1:5] = boxes[keep]
    return im, labels, polygons[keep]


def random_flips(im: np.ndarray, polygons: np.ndarray, rng: np.random.Generator, flipud: float,
                 fliplr: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~yolotrain.data.augment.random_flips` (the same draws) for pixel polygons ``(n, P, 2)``."""
    height, width = im.shape[:2]
    ud, lr = rng.random(2)
    if ud < flipud:
        im = cv2.flip(im, 0)
        polygons = np.stack((polygons[..., 0], height - polygons[..., 1]), -1)
    if lr < fliplr:
        im = cv2.flip(im, 1)
        polygons = np.stack((width - polygons[..., 0], polygons[..., 1]), -1)
    return im, polygons


def rotated_rows(classes: np.ndarray, boxes: np.ndarray, width: int, height: int) -> np.ndarray:
    """Rows ``(n, 6)`` float32 of class and pixel xywhr box with cx, w over ``width`` and cy, h over ``height``."""
    boxes = boxes.copy()
    boxes[:, [0, 2]] /= width
    boxes[:, [1, 3]] /= height
    return np.concatenate((classes[:, None], boxes), 1).astype(np.float32)
