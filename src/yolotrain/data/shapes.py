"""A small synthetic 2-class dataset (circles and rectangles) that a CPU model learns quickly.

Images have textured, noisy backgrounds and 1-6 objects of varied size, aspect ratio and colour,
with some partial occlusion. Labels are YOLO-seg polygons (an ellipse's outline, a rectangle's corners)
whose bounding boxes are the objects' boxes, so detection and segmentation models both train on it.
Two variants serve the other box tasks: ``labels="pose"`` writes each object's box and four keypoints
(:data:`KEYPOINT_NAMES`: a rectangle's corners, the points of an ellipse on its box's diagonals), with
``kpt_shape`` and ``flip_idx`` in ``data.yaml``; ``labels="obb"`` draws the objects turned by any angle
and writes each one's rotated box as its four corners (DOTA's ``class x1 y1 ... x4 y4``).
Generation is deterministic: the same parameters give byte-identical files. The dataset is written
once to a cache folder keyed by its parameters and reused after.

Run ``yolotrain data shapes [--labels pose|obb] [--root DIR]`` to generate it and print its path.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml

from ..atomic import current_umask
from .cachedir import cache_root

CLASS_NAMES = ("circle", "rectangle")
# Bump when the drawing changes so old caches are not mistaken for the new output.
GENERATOR_VERSION = 3
ELLIPSE_POINTS = 32  # outline points of a circle's polygon (a multiple of 4: its extremes are vertices)
MAX_OBJECTS = 4
# A new object may cover at most this share of an earlier one, so every labelled object stays visible.
MAX_OCCLUSION = 0.4
OUTLINE = (20, 20, 20)
HATCH_PERIOD = 3  # pixels per stripe of the rectangles' fill
# The pose variant's keypoints of every object, in label order; a left-right flip swaps the left and right ones.
KEYPOINT_NAMES = ("top-left", "top-right", "bottom-right", "bottom-left")
FLIP_IDX = (1, 0, 3, 2)
# Keypoint visibility as COCO writes it: 2 visible, 1 labelled but hidden (here: under a later object's box).
VISIBLE, HIDDEN = 2, 1


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Smooth colour blobs + fine stripes + pixel noise, so objects are not found by a flat-colour test."""
    # Muted blobs (64..192): textured, yet the saturated object fills keep some colour contrast.
    coarse = rng.integers(64, 193, (rng.integers(3, 9), rng.integers(3, 9), 3)).astype(np.float32)
    bg = cv2.resize(coarse, (size, size), interpolation=cv2.INTER_CUBIC)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    angle, freq = rng.uniform(0, np.pi), rng.uniform(0.05, 0.4)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * freq) * rng.uniform(0, 25)
    bg += stripes[..., None] + rng.normal(0, 10, (size, size, 3)).astype(np.float32)
    return np.clip(bg, 0, 255).astype(np.uint8)


def _ioa(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Share of each of ``boxes`` (m, 4 xyxy) covered by ``box``."""
    lt = np.maximum(box[:2], boxes[:, :2])
    rb = np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
    return inter / np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)


def _hatched_rectangle(im: np.ndarray, p1: tuple[int, int], p2: tuple[int, int], colour: tuple[int, ...]) -> None:
    """Fill ``p1..p2`` (inclusive) with ``colour`` and diagonal stripes of a darker shade."""
    region = im[p1[1]:p2[1] + 1, p1[0]:p2[0] + 1]
    yy, xx = np.mgrid[0:region.shape[0], 0:region.shape[1]]
    stripe = ((xx + yy) // HATCH_PERIOD) % 2 == 0
    fill = np.array(colour, dtype=np.uint8)
    region[...] = np.where(stripe[..., None], fill // 3, fill)


def _rotated_corners(centre: np.ndarray, w: float, h: float, angle: float) -> np.ndarray:
    """The corners ``(4, 2)`` of a ``w`` x ``h`` rectangle about ``centre`` turned by ``angle`` (radians, clockwise
    in image coordinates), from its top-left corner before turning, clockwise."""
    half = np.array([[-w, -h], [w, -h], [w, h], [-w, h]]) / 2
    cos, sin = np.cos(angle), np.sin(angle)
    return centre + half @ np.array([[cos, sin], [-sin, cos]])


def _draw_rotated(im: np.ndarray, cls: int, corners: np.ndarray, w: float, h: float, angle: float,
                  colour: tuple[int, ...]) -> None:
    """Draw a turned object: an ellipse inscribed in ``corners`` (circles, flat fill) or the hatched rectangle."""
    if cls == 0:
        ellipse = (tuple(corners.mean(0)), (w, h), float(np.degrees(angle)))
        cv2.ellipse(im, ellipse, colour, -1, cv2.LINE_AA)
        cv2.ellipse(im, ellipse, OUTLINE, 2, cv2.LINE_AA)
        return
    inside = np.zeros(im.shape[:2], np.uint8)
    cv2.fillPoly(inside, [np.round(corners).astype(np.int32)], 1, cv2.LINE_8)
    yy, xx = np.mgrid[0:im.shape[0], 0:im.shape[1]]
    fill = np.array(colour, dtype=np.uint8)
    hatched = np.where((((xx + yy) // HATCH_PERIOD) % 2 == 0)[..., None], fill // 3, fill)
    im[inside == 1] = hatched[inside == 1]
    cv2.polylines(im, [np.round(corners).astype(np.int32)], True, OUTLINE, 2, cv2.LINE_AA)


def draw_sample(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One image (BGR uint8) and its labels ``(n, 5)`` = class, cx, cy, w, h normalised (the polygons are
    :func:`object_polygon` of each label)."""
    im, labels, _ = _draw_objects(rng, size, turned=False)
    return im, labels


def _draw_objects(rng: np.random.Generator, size: int, turned: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    im = _background(rng, size)
    boxes: list[np.ndarray] = []
    classes: list[int] = []
    turned_corners: list[np.ndarray] = []
    for _ in range(int(rng.integers(1, MAX_OBJECTS + 1))):
        for _attempt in range(20):
            cls = int(rng.integers(0, len(CLASS_NAMES)))
            side = rng.uniform(0.15, 0.5) * size
            aspect = np.exp(rng.uniform(-0.6, 0.6))
            w, h = max(8.0, side * aspect), max(8.0, side / aspect)
            if turned:  # the turned object's axis-aligned box must fit the image
                angle = rng.uniform(0, np.pi)
                corners = _rotated_corners(np.zeros(2), w, h, angle)
                span = corners.max(0) - corners.min(0)
                centre = rng.uniform(span / 2, size - span / 2)
                corners = corners + centre
                box = np.concatenate([corners.min(0), corners.max(0)])
            else:
                x1, y1 = rng.uniform(0, size - w), rng.uniform(0, size - h)
                box = np.array([x1, y1, x1 + w, y1 + h])
            if not boxes or (_ioa(box, np.stack(boxes)) <= MAX_OCCLUSION).all():
                break
        else:
            continue  # no free spot: fewer objects in this image
        if turned:
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            _draw_rotated(im, cls, corners, w, h, angle, colour)
            boxes.append(box)
            classes.append(cls)
            turned_corners.append(corners / size)
            continue
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        p1, p2 = tuple(int(v) for v in np.round(box[:2])), tuple(int(v) for v in np.round(box[2:]) - 1)
        # A dark outline makes the object's edge stand out from any background colour, and the two
        # classes differ in fill as well as outline (circles flat, rectangles hatched): a cue that
        # survives mosaic crops, so a small model learns the task in a few hundred CPU steps.
        if cls == 0:
            centre = ((p1[0] + p2[0]) // 2, (p1[1] + p2[1]) // 2)
            axes = ((p2[0] - p1[0]) // 2, (p2[1] - p1[1]) // 2)
            cv2.ellipse(im, centre, axes, 0, 0, 360, colour, -1, cv2.LINE_AA)
            cv2.ellipse(im, centre, axes, 0, 0, 360, OUTLINE, 2, cv2.LINE_AA)
        else:
            _hatched_rectangle(im, p1, p2, colour)
            cv2.rectangle(im, p1, p2, OUTLINE, 2, cv2.LINE_AA)
        box = np.array([p1[0], p1[1], p2[0] + 1, p2[1] + 1], dtype=np.float64)
        boxes.append(box)
        classes.append(cls)
    if not boxes:
        return im, np.zeros((0, 5)), np.zeros((0, 4, 2))
    b = np.stack(boxes) / size
    labels = np.column_stack([classes, (b[:, :2] + b[:, 2:]) / 2, b[:, 2:] - b[:, :2]])
    return im, labels, np.stack(turned_corners) if turned else np.zeros((0, 4, 2))


def object_keypoints(labels: np.ndarray) -> np.ndarray:
    """The keypoints ``(n, 4, 3)`` (x, y normalised, visibility) of drawn objects from their label rows, in the
    order of :data:`KEYPOINT_NAMES`: a rectangle's corners, an ellipse's points on its box's diagonals. A
    keypoint inside the box of an object drawn later (a later row) is :data:`HIDDEN`, else :data:`VISIBLE`."""
    cls, cx, cy, w, h = labels.T[:, :, None]
    corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], np.float64)  # in KEYPOINT_NAMES' order
    reach = np.where(cls == 0, np.sqrt(0.5), 1.0)  # an ellipse meets its box's diagonals at 1/sqrt(2) of them
    xy = np.stack([cx + corners[:, 0] * reach * w / 2, cy + corners[:, 1] * reach * h / 2], -1)
    x1, y1, x2, y2 = (labels[:, 1] - labels[:, 3] / 2, labels[:, 2] - labels[:, 4] / 2,
                      labels[:, 1] + labels[:, 3] / 2, labels[:, 2] + labels[:, 4] / 2)
    # covered[i, k, j]: keypoint k of object i lies in the box of object j, drawn after it (j > i).
    covered = ((xy[..., 0, None] > x1) & (xy[..., 0, None] < x2) & (xy[..., 1, None] > y1) & (xy[..., 1, None] < y2)
               & np.triu(np.ones((len(labels), len(labels)), bool), 1)[:, None, :])
    visibility = np.where(covered.any(-1), HIDDEN, VISIBLE)
    return np.concatenate([xy, visibility[..., None].astype(np.float64)], -1)


def object_polygon(label: np.ndarray) -> np.ndarray:
    """The outline ``(k, 2)`` (normalised) of a drawn object from its label row: a circle's ellipse through the
    middles of its box's sides, a rectangle's four corners; its bounding box is the label's box."""
    cls, cx, cy, w, h = label
    if int(cls) == 0:
        angle = np.linspace(0, 2 * np.pi, ELLIPSE_POINTS, endpoint=False)
        cos, sin = np.cos(angle), np.sin(angle)
        cos[::ELLIPSE_POINTS // 4], sin[::ELLIPSE_POINTS // 4] = (1, 0, -1, 0), (0, 1, 0, -1)  # exact extremes
        return np.stack([cx + w / 2 * cos, cy + h / 2 * sin], 1)
    x1, y1, x2, y2 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    return np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]])


def _polygon_rows(labels: np.ndarray, corners: np.ndarray) -> list[np.ndarray]:
    return [object_polygon(row).ravel() for row in labels]


def _keypoint_rows(labels: np.ndarray, corners: np.ndarray) -> list[np.ndarray]:
    return list(np.concatenate([labels[:, 1:], object_keypoints(labels).reshape(len(labels), -1)], 1))


def _corner_rows(labels: np.ndarray, corners: np.ndarray) -> list[np.ndarray]:
    return list(corners.reshape(len(corners), 8))


@dataclass(frozen=True)
class LabelKind:
    """One variant of the dataset: whether its objects are turned by any angle, each object's values after its class
    in a label file (from the labels ``(n, 5)`` and the turned objects' corners ``(n, 4, 2)``), and the fields its
    ``data.yaml`` adds."""

    turned: bool
    rows: Callable[[np.ndarray, np.ndarray], list[np.ndarray]]
    yaml_fields: dict[str, Any] = field(default_factory=dict)


# What the label files hold: YOLO-seg polygons (detection and segmentation), boxes with keypoints, rotated boxes.
LABEL_KINDS: dict[str, LabelKind] = {
    "polygons": LabelKind(False, _polygon_rows),
    "pose": LabelKind(False, _keypoint_rows, {"kpt_shape": [len(KEYPOINT_NAMES), 3], "flip_idx": list(FLIP_IDX)}),
    "obb": LabelKind(True, _corner_rows),
}


def _write_split(root: Path, split: str, n: int, size: int, seed: int, split_id: int, kind: LabelKind) -> None:
    (root / "images" / split).mkdir(parents=True)
    (root / "labels" / split).mkdir(parents=True)
    for i in range(n):
        # One generator per image: a split's images do not depend on the other split's size.
        im, labels, corners = _draw_objects(np.random.default_rng([seed, split_id, i]), size, kind.turned)
        ok, buf = cv2.imencode(".jpg", im, [cv2.IMWRITE_JPEG_QUALITY, 92])
        if not ok:
            raise OSError(f"JPEG encoding failed for {split} image {i}")
        (root / "images" / split / f"{i:05d}.jpg").write_bytes(buf.tobytes())
        rows = "".join(f"{int(row[0])} " + " ".join(f"{v:.6f}" for v in values) + "\n"
                       for row, values in zip(labels, kind.rows(labels, corners)))
        (root / "labels" / split / f"{i:05d}.txt").write_text(rows)


def generate_shapes_dataset(
    root: str | os.PathLike | None = None,
    n_train: int = 160,
    n_val: int = 40,
    img_size: int = 256,
    seed: int = 0,
    labels: str = "polygons",
) -> Path:
    """Generate (or reuse) the shapes dataset and return its folder.

    The folder holds ``images/{train,val}``, ``labels/{train,val}`` and ``data.yaml``. It lives in
    ``root`` (default ``$YOLOTRAIN_CACHE/shapes`` or ``~/.cache/yolotrain/shapes``) under a name made
    of the parameters, is built in a temporary folder and renamed into place, and is reused when it
    already exists. ``labels`` is what its label files hold (:data:`LABEL_KINDS`; see the module's docstring).
    """
    if n_train < 1 or n_val < 1 or img_size < 32:
        raise ValueError(f"need n_train, n_val >= 1 and img_size >= 32, got {n_train}, {n_val}, {img_size}")
    if labels not in LABEL_KINDS:
        raise ValueError(f"labels must be one of {', '.join(LABEL_KINDS)}, got {labels!r}")
    parent = Path(root).expanduser() if root is not None else cache_root() / "shapes"
    variant = "" if labels == "polygons" else f"{labels}-"
    final = parent / f"shapes-{variant}v{GENERATOR_VERSION}-n{n_train}-{n_val}-s{img_size}-seed{seed}"
    if (final / "data.yaml").is_file():
        return final
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=parent))
    try:
        kind = LABEL_KINDS[labels]
        _write_split(tmp, "train", n_train, img_size, seed, 0, kind)
        _write_split(tmp, "val", n_val, img_size, seed, 1, kind)
        cfg = {"path": ".", "train": "images/train", "val": "images/val", "nc": len(CLASS_NAMES),
               "names": list(CLASS_NAMES), **kind.yaml_fields}
        (tmp / "data.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        tmp.chmod(0o777 & ~current_umask())  # mkdtemp makes it 0700; give it a plain mkdir's mode
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "data.yaml").is_file():  # not a concurrent winner: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return final
