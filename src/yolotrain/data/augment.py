"""Image + box augmentations: letterbox, 4-image mosaic, random affine/perspective, HSV gains, flips,
mixup, and for segmentation copy-paste. Boxes (and polygons: lists of ``(k, 2)`` pixel arrays, one per
box) travel with the pixels and are clipped and filtered by the reference's candidate rule.

Every random draw comes from an explicit ``np.random.Generator`` so a sample is a pure function of
its seed; nothing here touches global random state. Boxes are ``(n, 5)`` arrays of
(class, x1, y1, x2, y2) in pixels unless stated otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from ..boxes import letterbox_geometry
from ..settings import from_mapping, setting

PAD_VALUE = 114

@dataclass(frozen=True)
class AugmentConfig:
    """Training augmentations; the defaults are the reference's ``hyp.scratch-low.yaml``."""

    hsv_h: float = setting(0.015, "hue gain (fraction)", min=0, max=1)
    hsv_s: float = setting(0.7, "saturation gain (fraction)", min=0, max=1)
    hsv_v: float = setting(0.4, "value (brightness) gain (fraction)", min=0, max=1)
    degrees: float = setting(0.0, "rotation range (+/- degrees)", min=0, max=180)
    translate: float = setting(0.1, "translation range (+/- fraction of the image)", min=0, max=0.9)
    scale: float = setting(0.5, "scale range (+/- gain)", min=0, max=0.95)
    shear: float = setting(0.0, "shear range (+/- degrees)", min=0, max=89)
    perspective: float = setting(0.0, "perspective range (+/- fraction; 0..0.001 is sensible)", min=0, max=0.01)
    flipud: float = setting(0.0, "probability of an up-down flip", min=0, max=1)
    fliplr: float = setting(0.5, "probability of a left-right flip", min=0, max=1)
    mosaic: float = setting(1.0, "probability of a 4-image mosaic", min=0, max=1)
    mixup: float = setting(0.0, "probability of mixing two mosaics", min=0, max=1)
    copy_paste: float = setting(0.0, "segmentation: share of a mosaic's objects pasted again, flipped left-right, "
                                "where they cover under 30 per cent of any other", min=0, max=1)
    close_mosaic: int = setting(0, "turn mosaic off for the last N epochs", min=0)

    @classmethod
    def coerce(cls, value: AugmentConfig | Mapping[str, float] | None) -> AugmentConfig:
        """The settings themselves, or the defaults updated from a mapping (validated: a typo is an error)."""
        if isinstance(value, cls):
            return value
        return from_mapping(cls, value or {})


def letterbox(
    im: np.ndarray, new_shape: int | Sequence[int], scaleup: bool = True
) -> tuple[np.ndarray, float, tuple[float, float]]:
    """Resize keeping aspect ratio and pad (value 114) to ``new_shape`` (h, w), image centred.

    Returns the image, the scale ratio and the (left, top) padding in pixels, so that
    ``x_new = x_old * ratio + pad`` (geometry from :func:`yolotrain.boxes.letterbox_geometry`).
    """
    h0, w0 = im.shape[:2]
    nh, nw = (new_shape, new_shape) if isinstance(new_shape, int) else (int(new_shape[0]), int(new_shape[1]))
    r, resized, pad = letterbox_geometry(np.array([w0, h0]), np.array([nw, nh]), scaleup)
    uw, uh = (int(v) for v in resized)
    left, top = (int(v) for v in pad)
    if (uw, uh) != (w0, h0):
        im = cv2.resize(im, (uw, uh), interpolation=cv2.INTER_LINEAR)
    im = cv2.copyMakeBorder(im, top, nh - uh - top, left, nw - uw - left, cv2.BORDER_CONSTANT,
                            value=(PAD_VALUE,) * 3)
    return im, float(r[0]), (float(left), float(top))


def box_candidates(
    box1: np.ndarray, box2: np.ndarray, wh_thr: float = 2, ar_thr: float = 100, area_thr: float = 0.1,
    eps: float = 1e-16,
) -> np.ndarray:
    """Mask of boxes worth keeping after augmentation: ``box1`` before (scaled), ``box2`` after, both
    ``(4, n)`` xyxy. Kept when wider and taller than ``wh_thr`` px, keeping over ``area_thr`` of the
    area, with aspect ratio under ``ar_thr``."""
    w1, h1 = box1[2] - box1[0], box1[3] - box1[1]
    w2, h2 = box2[2] - box2[0], box2[3] - box2[1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def random_perspective(
    im: np.ndarray, labels: np.ndarray, rng: np.random.Generator, hyp: AugmentConfig,
    border: tuple[int, int] = (0, 0),
) -> tuple[np.ndarray, np.ndarray]:
    """Random rotation, scale, shear, translation and perspective about the image centre.

    ``border`` (y, x) grows (positive) or crops (negative) the output on each side; the mosaic uses
    ``-size/2`` to cut its 2x canvas back to ``size``. Boxes are warped by their 4 corners, clipped,
    and filtered with :func:`box_candidates`.
    """
    im, M, s, perspective = random_warp(im, rng, hyp, border)
    return im, warp_boxes(labels, M, s, perspective, im.shape[1], im.shape[0])


def warp_boxes(labels: np.ndarray, M: np.ndarray, scale: float, perspective: bool, width: int,
               height: int) -> np.ndarray:
    """Labels (class + pixel xyxy) warped by the 3x3 ``M``: the box of each box's 4 warped corners,
    clipped to the ``width`` x ``height`` image, filtered by :func:`box_candidates` (``scale``: the
    warp's scale, by which the boxes' former areas are compared)."""
    new, keep = warped_boxes(labels, M, scale, perspective, width, height)
    labels = labels[keep]
    labels[:, 1:5] = new[keep]
    return labels


def warped_boxes(labels: np.ndarray, M: np.ndarray, scale: float, perspective: bool, width: int,
                 height: int) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`warp_boxes` computes, unfiltered: every row's warped, clipped xyxy ``(n, 4)`` and the mask of
    the rows :func:`box_candidates` keeps (for callers that filter data of their own by the same rows)."""
    n = len(labels)
    if not n:
        return np.zeros((0, 4)), np.zeros(0, bool)
    corners = labels[:, [1, 2, 3, 4, 1, 4, 3, 2]].reshape(n, 4, 2)
    xy = warp_points(corners, M, perspective).reshape(n, 8)
    x, y = xy[:, 0::2], xy[:, 1::2]
    new = np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], 1)
    new[:, [0, 2]] = new[:, [0, 2]].clip(0, width)
    new[:, [1, 3]] = new[:, [1, 3]].clip(0, height)
    return new, box_candidates(labels[:, 1:5].T * scale, new.T)


def warp_points(xy: np.ndarray, M: np.ndarray, perspective: bool) -> np.ndarray:
    """Pixel points ``(..., 2)`` moved by the 3x3 warp ``M`` (divided by their third coordinate when it is a
    perspective one)."""
    flat = xy.reshape(-1, 2)
    moved = np.concatenate((flat, np.ones((len(flat), 1))), 1) @ M.T
    moved = moved[:, :2] / moved[:, 2:3] if perspective else moved[:, :2]
    return moved.reshape(xy.shape)


# Polygons are resampled to this many points before a warp, so their warped outline stays faithful.
POLYGON_POINTS = 1000


def random_perspective_segments(
    im: np.ndarray, labels: np.ndarray, segments: Sequence[np.ndarray], rng: np.random.Generator,
    hyp: AugmentConfig, border: tuple[int, int] = (0, 0),
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """:func:`random_perspective` (the same random draws) for labels with polygons: each polygon (pixels)
    is resampled to :data:`POLYGON_POINTS` points and warped, its box is that of its points inside the
    image, and the candidate rule keeps boxes over 1% of their former area (the reference's values)."""
    im, M, s, perspective = random_warp(im, rng, hyp, border)
    height, width = im.shape[:2]
    if not len(labels):
        return im, labels, []
    warped = []
    for polygon in resample_polygons(segments):
        xy = np.concatenate((polygon, np.ones((len(polygon), 1))), 1) @ M.T
        warped.append(xy[:, :2] / xy[:, 2:3] if perspective else xy[:, :2])
    new = np.stack([_inside_box(xy, width, height) for xy in warped])
    keep = box_candidates(labels[:, 1:5].T * s, new.T, area_thr=0.01)
    labels = labels[keep]
    labels[:, 1:5] = new[keep]
    return im, labels, [xy for xy, k in zip(warped, keep) if k]


def resample_polygons(polygons: Sequence[np.ndarray], points: int = POLYGON_POINTS) -> list[np.ndarray]:
    """Each closed polygon ``(k, 2)`` as ``points`` points evenly spaced in vertex index (the reference's rule)."""
    out = []
    for polygon in polygons:
        closed = np.concatenate((polygon, polygon[:1]), 0)
        at = np.linspace(0, len(closed) - 1, points)
        vertex = np.arange(len(closed))
        out.append(np.stack([np.interp(at, vertex, closed[:, 0]), np.interp(at, vertex, closed[:, 1])], 1))
    return out


def _inside_box(xy: np.ndarray, width: int, height: int) -> np.ndarray:
    """xyxy of a polygon's points inside the image (zeros when none is, as the reference's ``segment2box``)."""
    inside = (xy[:, 0] >= 0) & (xy[:, 1] >= 0) & (xy[:, 0] <= width) & (xy[:, 1] <= height)
    x, y = xy[inside, 0], xy[inside, 1]
    return np.array([x.min(), y.min(), x.max(), y.max()]) if x.any() else np.zeros(4)


def random_warp(im: np.ndarray, rng: np.random.Generator, hyp: AugmentConfig,
                border: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """The random perspective's image (the draws of :func:`random_perspective`): the warped image, its 3x3 matrix,
    the scale drawn and whether the warp is a perspective one, for callers that move points of their own."""
    M, s, perspective, (height, width) = random_warp_matrix(im.shape[:2], rng, hyp, border)
    if border != (0, 0) or (M != np.eye(3)).any():
        im = _warp(im, M, perspective, width, height)
    return im, M, s, perspective


def random_warp_matrix(shape: tuple[int, int], rng: np.random.Generator, hyp: AugmentConfig,
                       border: tuple[int, int]) -> tuple[np.ndarray, float, bool, tuple[int, int]]:
    """The random warp of an image of ``shape`` (h, w): its 3x3 matrix, the scale drawn, whether it is a
    perspective one, and the output's (h, w) (``shape`` grown by ``border`` on each side)."""
    height, width = shape[0] + border[0] * 2, shape[1] + border[1] * 2
    C = np.eye(3)
    C[0, 2], C[1, 2] = -shape[1] / 2, -shape[0] / 2
    P = np.eye(3)
    P[2, 0], P[2, 1] = rng.uniform(-hyp.perspective, hyp.perspective, 2)
    R = np.eye(3)
    angle = rng.uniform(-hyp.degrees, hyp.degrees)
    s = rng.uniform(1 - hyp.scale, 1 + hyp.scale)
    R[:2] = cv2.getRotationMatrix2D(angle=angle, center=(0, 0), scale=s)
    S = np.eye(3)
    S[0, 1], S[1, 0] = np.tan(np.deg2rad(rng.uniform(-hyp.shear, hyp.shear, 2)))
    T = np.eye(3)
    T[0, 2], T[1, 2] = rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate, 2) * (width, height)
    return T @ S @ R @ P @ C, s, bool(hyp.perspective), (height, width)  # applied right to left


def _warp(im: np.ndarray, M: np.ndarray, perspective: bool, width: int, height: int) -> np.ndarray:
    fill = (PAD_VALUE,) * 3
    if perspective:
        return cv2.warpPerspective(im, M, dsize=(width, height), borderValue=fill)
    return cv2.warpAffine(im, M[:2], dsize=(width, height), borderValue=fill)


def _tile_placement(i: int, h: int, w: int, xc: int, yc: int, side: int) -> tuple[int, ...]:
    """Where mosaic tile ``i`` (h x w) goes around the centre (xc, yc) of a ``side``-square canvas:
    (x1a, y1a, x2a, y2a) on the canvas and (x1b, y1b, x2b, y2b) of the tile's own pixels."""
    if i == 0:  # top left
        x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
        return x1a, y1a, x2a, y2a, w - (x2a - x1a), h - (y2a - y1a), w, h
    if i == 1:  # top right
        x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, side), yc
        return x1a, y1a, x2a, y2a, 0, h - (y2a - y1a), min(w, x2a - x1a), h
    if i == 2:  # bottom left
        x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(side, yc + h)
        return x1a, y1a, x2a, y2a, w - (x2a - x1a), 0, w, min(y2a - y1a, h)
    x1a, y1a, x2a, y2a = xc, yc, min(xc + w, side), min(side, yc + h)  # bottom right
    return x1a, y1a, x2a, y2a, 0, 0, min(w, x2a - x1a), min(y2a - y1a, h)


def mosaic_warp(
    tiles: Sequence[tuple[tuple[int, int], np.ndarray]], load: Callable[[int], np.ndarray], size: int,
    rng: np.random.Generator, hyp: AugmentConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`mosaic4` then :func:`random_perspective` cutting the canvas back to ``size`` (the same draws
    and boxes; pixels equal but for rare +/-1 roundings of the shifted warp), building only the part of
    the canvas the warp reads.

    ``tiles`` are ((h, w) of the loaded image, labels class + normalised cxcywh); ``load(k)`` gives tile
    ``k``'s image and is called only for tiles the warped output shows: on average a third of the
    ``2*size`` canvas is in view, and tiles wholly outside it are neither decoded nor copied.
    """
    side = 2 * size
    yc, xc = (int(v) for v in rng.uniform(size / 2, 1.5 * size, 2))
    places = [_tile_placement(i, h, w, xc, yc, side) for i, ((h, w), _) in enumerate(tiles)]
    out = [xywhn_to_xyxy(lab, w, h, p[0] - p[4], p[1] - p[5]) for ((h, w), lab), p in zip(tiles, places)]
    labels = np.concatenate(out, 0)
    labels[:, 1:] = labels[:, 1:].clip(0, side)
    border = -size // 2
    M, s, perspective, (height, width) = random_warp_matrix((side, side), rng, hyp, (border, border))
    x0, y0, x1, y1 = _source_window(M, perspective, width, height, side)
    canvas = _scratch((max(y1 - y0, 1), max(x1 - x0, 1), 3))
    canvas.fill(PAD_VALUE)
    for k, (x1a, y1a, x2a, y2a, x1b, y1b, _, _) in enumerate(places):
        cx0, cy0, cx1, cy1 = max(x1a, x0), max(y1a, y0), min(x2a, x1), min(y2a, y1)
        if cx0 < cx1 and cy0 < cy1:
            bx, by = x1b + cx0 - x1a, y1b + cy0 - y1a
            canvas[cy0 - y0:cy1 - y0, cx0 - x0:cx1 - x0] = load(k)[by:by + cy1 - cy0, bx:bx + cx1 - cx0]
    shift = np.eye(3)
    shift[0, 2], shift[1, 2] = x0, y0
    im = _warp(canvas, M @ shift, perspective, width, height)
    return im, warp_boxes(labels, M, s, perspective, width, height)


_SCRATCH = threading.local()


def _scratch(shape: tuple[int, int, int]) -> np.ndarray:
    """A uint8 array of ``shape`` in a buffer this thread reuses: a fresh multi-megabyte canvas per sample
    costs more in page faults than in filling it. Only for arrays consumed before the next call."""
    size = int(np.prod(shape))
    buffer = getattr(_SCRATCH, "buffer", None)
    if buffer is None or buffer.size < size:
        buffer = _SCRATCH.buffer = np.empty(size, np.uint8)
    return buffer[:size].reshape(shape)


def _source_window(M: np.ndarray, perspective: bool, width: int, height: int,
                   side: int) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of the canvas pixels an affine warp to ``width`` x ``height`` reads, with a margin
    for interpolation, within the ``side``-square canvas (all of it for a perspective or degenerate warp)."""
    if perspective or abs(np.linalg.det(M[:2, :2])) < 1e-9:  # a shear can flatten the warp to a line
        return 0, 0, side, side
    corners = np.array([[0, 0, 1], [width, 0, 1], [0, height, 1], [width, height, 1]], np.float64)
    xy = corners @ np.linalg.inv(M).T
    lo = np.floor(xy[:, :2].min(0)).astype(int) - 2
    hi = np.ceil(xy[:, :2].max(0)).astype(int) + 3
    x0, y0 = np.clip(lo, 0, side)
    x1, y1 = np.clip(hi, 0, side)
    return int(x0), int(y0), int(max(x1, x0)), int(max(y1, y0))


def mosaic4(
    tiles: Sequence[tuple[np.ndarray, np.ndarray]], size: int, rng: np.random.Generator,
    segments: list[np.ndarray] | None = None, placements: list[tuple[int, int, int, int]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Place 4 images around a random centre of a ``2*size`` canvas (pad 114).

    ``tiles`` are (image, labels (n, 5) class + normalised cx, cy, w, h); returns the canvas and the
    labels as class + pixel xyxy on it, clipped to the canvas. ``segments``, a list given empty, receives
    the tiles' polygons (``tiles`` then hold (image, labels, polygons normalised)) in pixels on the canvas,
    clipped to it as the boxes are. ``placements``, a list given empty, receives each tile's (w, h, x offset,
    y offset): a normalised point ``p`` of the tile lies at ``p * (w, h) + offset`` on the canvas (for labels
    that place points of their own, such as keypoints).
    """
    s = size
    yc, xc = (int(v) for v in rng.uniform(s / 2, 1.5 * s, 2))
    canvas = np.full((2 * s, 2 * s, 3), PAD_VALUE, dtype=np.uint8)
    out = []
    for i, (img, lab, *polygons) in enumerate(tiles):
        h, w = img.shape[:2]
        x1a, y1a, x2a, y2a, x1b, y1b, x2b, y2b = _tile_placement(i, h, w, xc, yc, 2 * s)
        canvas[y1a:y2a, x1a:x2a] = img[y1b:y2b, x1b:x2b]
        out.append(xywhn_to_xyxy(lab, w, h, x1a - x1b, y1a - y1b))
        if placements is not None:
            placements.append((w, h, x1a - x1b, y1a - y1b))
        if segments is not None:
            offset = np.array([x1a - x1b, y1a - y1b])
            segments.extend((p * (w, h) + offset).clip(0, 2 * s) for p in polygons[0])
    labels = np.concatenate(out, 0)
    labels[:, 1:] = labels[:, 1:].clip(0, 2 * s)
    return canvas, labels


def copy_paste(im: np.ndarray, labels: np.ndarray, segments: list[np.ndarray], p: float,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Copy-paste (Ghiasi et al. 2021) as the reference does it: ``round(p * n)`` objects, each pasted
    mirrored left-right (pixels inside its polygon) unless its mirrored box would cover 30% or more of a
    box already there; ``labels`` class + pixel xyxy, ``segments`` pixel polygons, one per label."""
    n = len(segments)
    if not (p and n):
        return im, labels, segments
    h, w = im.shape[:2]
    pasted = np.zeros((h, w), np.uint8)
    segments = list(segments)
    for j in rng.choice(n, size=round(p * n), replace=False):
        cls, x1, y1, x2, y2 = labels[j]
        box = np.array([w - x2, y1, w - x1, y2])
        if (_covered_share(box, labels[:, 1:5]) < 0.30).all():
            labels = np.concatenate((labels, [[cls, *box]]), 0)
            segments.append(np.concatenate((w - segments[j][:, :1], segments[j][:, 1:2]), 1))
            cv2.drawContours(pasted, [segments[j].astype(np.int32)], -1, 1, cv2.FILLED)
    where = cv2.flip(pasted, 1).astype(bool)
    im = im.copy()
    im[where] = cv2.flip(im, 1)[where]
    return im, labels, segments


def _covered_share(box: np.ndarray, boxes: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    """Intersection of ``box`` with each of ``boxes`` (xyxy) over that box's area."""
    width = (np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0])).clip(0)
    height = (np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1])).clip(0)
    return width * height / ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) + eps)


def xywhn_to_xyxy(labels: np.ndarray, w: float, h: float, padw: float = 0.0, padh: float = 0.0) -> np.ndarray:
    """Class + normalised (cx, cy, w, h) → class + pixel (x1, y1, x2, y2) on an image of size w x h
    placed at offset (padw, padh)."""
    out = labels.astype(np.float64, copy=True)
    out[:, 1] = w * (labels[:, 1] - labels[:, 3] / 2) + padw
    out[:, 2] = h * (labels[:, 2] - labels[:, 4] / 2) + padh
    out[:, 3] = w * (labels[:, 1] + labels[:, 3] / 2) + padw
    out[:, 4] = h * (labels[:, 2] + labels[:, 4] / 2) + padh
    return out


def xyxy_to_xywhn(labels: np.ndarray, w: int, h: int) -> np.ndarray:
    """Class + pixel xyxy → class + normalised (cx, cy, w, h), boxes clipped to the image first."""
    xyxy = labels[:, 1:5].copy()
    xyxy[:, [0, 2]] = xyxy[:, [0, 2]].clip(0, w - 1e-3)
    xyxy[:, [1, 3]] = xyxy[:, [1, 3]].clip(0, h - 1e-3)
    out = np.empty((len(labels), 5), np.float32)
    out[:, 0] = labels[:, 0]
    out[:, 1] = (xyxy[:, 0] + xyxy[:, 2]) / 2 / w
    out[:, 2] = (xyxy[:, 1] + xyxy[:, 3]) / 2 / h
    out[:, 3] = (xyxy[:, 2] - xyxy[:, 0]) / w
    out[:, 4] = (xyxy[:, 3] - xyxy[:, 1]) / h
    return out


def mixup(
    im: np.ndarray, labels: np.ndarray, im2: np.ndarray, labels2: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Blend two same-size images with a Beta(32, 32) ratio and keep the boxes of both."""
    r = rng.beta(32.0, 32.0)
    blended = cv2.addWeighted(im, r, im2, 1 - r, 0.0)
    return blended, np.concatenate((labels, labels2), 0)


def hsv_to_rgb(
    im: np.ndarray, rng: np.random.Generator, hgain: float, sgain: float, vgain: float
) -> np.ndarray:
    """Apply random HSV gains to a BGR image and return it as RGB.

    The conversion back from HSV writes RGB directly, so the BGR→RGB swap the model needs costs
    nothing extra. With all gains zero it is a plain channel swap.
    """
    if not (hgain or sgain or vgain):
        return cv2.cvtColor(im, cv2.COLOR_BGR2RGB)
    r = rng.uniform(-1, 1, 3) * (hgain, sgain, vgain) + 1
    x = np.arange(256, dtype=np.float64)
    lut = np.empty((256, 1, 3), np.uint8)  # one table per channel: a single pass over the image
    lut[:, 0, 0] = (x * r[0]) % 180
    lut[:, 0, 1] = np.clip(x * r[1], 0, 255)
    lut[:, 0, 2] = np.clip(x * r[2], 0, 255)
    hsv = cv2.cvtColor(im, cv2.COLOR_BGR2HSV)
    cv2.LUT(hsv, lut, dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=hsv)


def random_flips(
    im: np.ndarray, labels: np.ndarray, rng: np.random.Generator, flipud: float, fliplr: float
) -> tuple[np.ndarray, np.ndarray]:
    """Flip up-down / left-right with the given probabilities; labels are class + normalised cxcywh."""
    ud, lr = rng.random(2)
    if ud < flipud:
        im = cv2.flip(im, 0)
        labels[:, 2] = 1 - labels[:, 2]
    if lr < fliplr:
        im = cv2.flip(im, 1)
        labels[:, 1] = 1 - labels[:, 1]
    return im, labels

