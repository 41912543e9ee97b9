"""A small synthetic 2-class dataset (circles and rectangles) that a CPU model learns quickly.

Images have textured, noisy backgrounds and 1-6 objects of varied size, aspect ratio and colour,
with some partial occlusion. Labels are YOLO-seg polygons (an ellipse's outline, a rectangle's corners)
whose bounding boxes are the objects' boxes, so detection and segmentation models both train on it.
Generation is deterministic: the same parameters give byte-identical files. The dataset is written
once to a cache folder keyed by its parameters and reused after.

Run ``yolotrain data shapes [--root DIR]`` to generate it and print its path.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

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


def draw_sample(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One image (BGR uint8) and its labels ``(n, 5)`` = class, cx, cy, w, h normalised (the polygons are
    :func:`object_polygon` of each label)."""
    im = _background(rng, size)
    boxes: list[np.ndarray] = []
    classes: list[int] = []
    for _ in range(int(rng.integers(1, MAX_OBJECTS + 1))):
        for _attempt in range(20):
            cls = int(rng.integers(0, len(CLASS_NAMES)))
            side = rng.uniform(0.15, 0.5) * size
            aspect = np.exp(rng.uniform(-0.6, 0.6))
            w, h = max(8.0, side * aspect), max(8.0, side / aspect)
            x1, y1 = rng.uniform(0, size - w), rng.uniform(0, size - h)
            box = np.array([x1, y1, x1 + w, y1 + h])
            if not boxes or (_ioa(box, np.stack(boxes)) <= MAX_OCCLUSION).all():
                break
        else:
            continue  # no free spot: fewer objects in this image
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
        return im, np.zeros((0, 5))
    b = np.stack(boxes) / size
    labels = np.column_stack([classes, (b[:, :2] + b[:, 2:]) / 2, b[:, 2:] - b[:, :2]])
    return im, labels


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


def _write_split(root: Path, split: str, n: int, size: int, seed: int, split_id: int) -> None:
    (root / "images" / split).mkdir(parents=True)
    (root / "labels" / split).mkdir(parents=True)
    for i in range(n):
        # One generator per image: a split's images do not depend on the other split's size.
        im, labels = draw_sample(np.random.default_rng([seed, split_id, i]), size)
        ok, buf = cv2.imencode(".jpg", im, [cv2.IMWRITE_JPEG_QUALITY, 92])
        if not ok:
            raise OSError(f"JPEG encoding failed for {split} image {i}")
        (root / "images" / split / f"{i:05d}.jpg").write_bytes(buf.tobytes())
        rows = "".join(f"{int(row[0])} " + " ".join(f"{v:.6f}" for v in object_polygon(row).ravel()) + "\n"
                       for row in labels)
        (root / "labels" / split / f"{i:05d}.txt").write_text(rows)


def generate_shapes_dataset(
    root: str | os.PathLike | None = None,
    n_train: int = 160,
    n_val: int = 40,
    img_size: int = 256,
    seed: int = 0,
) -> Path:
    """Generate (or reuse) the shapes dataset and return its folder.

    The folder holds ``images/{train,val}``, ``labels/{train,val}`` and ``data.yaml``. It lives in
    ``root`` (default ``$YOLOTRAIN_CACHE/shapes`` or ``~/.cache/yolotrain/shapes``) under a name made
    of the parameters, is built in a temporary folder and renamed into place, and is reused when it
    already exists.
    """
    if n_train < 1 or n_val < 1 or img_size < 32:
        raise ValueError(f"need n_train, n_val >= 1 and img_size >= 32, got {n_train}, {n_val}, {img_size}")
    parent = Path(root).expanduser() if root is not None else cache_root() / "shapes"
    final = parent / f"shapes-v{GENERATOR_VERSION}-n{n_train}-{n_val}-s{img_size}-seed{seed}"
    if (final / "data.yaml").is_file():
        return final
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=parent))
    try:
        _write_split(tmp, "train", n_train, img_size, seed, 0)
        _write_split(tmp, "val", n_val, img_size, seed, 1)
        cfg = {"path": ".", "train": "images/train", "val": "images/val", "nc": len(CLASS_NAMES),
               "names": list(CLASS_NAMES)}
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
