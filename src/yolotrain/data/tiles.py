"""Cutting large oriented-box images (DOTA's, thousands of pixels across) into overlapping square tiles with their
labels, so that a model trains and validates at a tile's size: ``yolotrain data split``.

The windows and which labels each keeps follow Ultralytics' ``data/split_dota.py``: windows of ``size`` px start
every ``size - gap`` px (the last one of a row or column moved back to end at the image's edge), a window that
would hold less than :data:`MIN_COVER` of image is dropped, and a label goes to every window that holds at least
``min_share`` of its polygon's area; its corners are written relative to the tile, past its edges where the tile
cuts it, as the reference writes them (the loader clips them to the tile's rectangle of their orientation).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import cv2
import numpy as np
import yaml

from .sources import img2label_path, resolve_source

TILE_SIZE = 1024
TILE_GAP = 200
MIN_SHARE = 0.7  # of a label's polygon area inside a window, for the window to keep it (the reference's iof_thr)
MIN_COVER = 0.6  # of a window's area that must be image (the reference's im_rate_thr)


def tile_windows(height: int, width: int, size: int = TILE_SIZE, gap: int = TILE_GAP) -> np.ndarray:
    """The ``[n, 4]`` windows (x0, y0, x1, y1 pixels) that tile an image of ``height`` x ``width``."""
    if not 0 <= gap < size:
        raise ValueError(f"the gap must be from 0 to below the tile size {size}, got {gap}")
    step = size - gap

    def starts(length: int) -> list[int]:
        count = 1 if length <= size else math.ceil((length - size) / step + 1)
        found = [step * i for i in range(count)]
        if len(found) > 1 and found[-1] + size > length:
            found[-1] = length - size
        return found

    origins = np.array([(x, y) for x in starts(width) for y in starts(height)], np.int64)
    windows = np.concatenate((origins, origins + size), 1)
    inside = np.stack((windows[:, 0].clip(0, width), windows[:, 1].clip(0, height),
                       windows[:, 2].clip(0, width), windows[:, 3].clip(0, height)), 1)
    cover = (inside[:, 2] - inside[:, 0]) * (inside[:, 3] - inside[:, 1]) / size ** 2
    if not (cover > MIN_COVER).any():  # an image smaller than a window: its best-covering windows
        cover[np.abs(cover - cover.max()) < 0.01] = 1
    return windows[cover > MIN_COVER]


def shares_inside(polygons: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """``[n, m]``: the share of each convex polygon's area (``[n, k, 2]`` pixels) inside each window."""
    shares = np.zeros((len(polygons), len(windows)))
    low, high = polygons.min(1), polygons.max(1)
    overlapping = ((low[:, None] < windows[None, :, 2:]) & (high[:, None] > windows[None, :, :2])).all(-1)
    for i, j in zip(*np.nonzero(overlapping)):
        x0, y0, x1, y1 = windows[j].astype(np.float32)
        rectangle = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)
        polygon = polygons[i].astype(np.float32)
        area = abs(cv2.contourArea(polygon))
        shared, _ = cv2.intersectConvexConvex(polygon, rectangle)
        shares[i, j] = shared / max(area, 1e-6)
    return shares


def _read_rows(label: Path) -> tuple[np.ndarray, np.ndarray]:
    """Classes ``[n]`` and normalised corners ``[n, 4, 2]`` of a DOTA-style label file (none when missing)."""
    rows = [line.split() for line in label.read_text(encoding="utf-8").splitlines()] if label.is_file() else []
    rows = [row for row in rows if len(row) == 9]
    values = np.array(rows, np.float64).reshape(-1, 9)
    return values[:, 0].astype(int), values[:, 1:].reshape(-1, 4, 2)


def split_oriented_dataset(data: str | os.PathLike, out: str | os.PathLike, size: int = TILE_SIZE,
                           gap: int = TILE_GAP, min_share: float = MIN_SHARE) -> Path:
    """Tile every image of the train and val splits of the dataset ``data`` (a folder or YAML with DOTA-style
    label rows) into ``out``'s ``images/{train,val}`` and ``labels/{train,val}`` (tile ``STEM__SIZE__X___Y.jpg``,
    the reference's names; a tile without labels is kept as a background image) and write ``out/data.yaml`` with
    the source's class names; returns that YAML's path."""
    source = resolve_source(data)
    out = Path(out)
    for split in ("train", "val"):
        images_dir, labels_dir = out / "images" / split, out / "labels" / split
        images_dir.mkdir(parents=True, exist_ok=True)
        labels_dir.mkdir(parents=True, exist_ok=True)
        for image_path in getattr(source, split):
            image = cv2.imread(str(image_path))
            if image is None:
                raise ValueError(f"{image_path}: not a readable image")
            height, width = image.shape[:2]
            classes, corners = _read_rows(img2label_path(image_path))
            corners = corners * (width, height)
            windows = tile_windows(height, width, size, gap)
            kept = shares_inside(corners, windows) >= min_share
            for j, (x0, y0, x1, y1) in enumerate(windows.tolist()):
                tile = image[y0:y1, x0:x1]
                name = f"{image_path.stem}__{size}__{x0}___{y0}"
                cv2.imwrite(str(images_dir / f"{name}.jpg"), tile)
                own = (corners[kept[:, j]] - (x0, y0)) / (tile.shape[1], tile.shape[0])
                rows = [" ".join([str(c), *(f"{v:.6g}" for v in points.reshape(-1))])
                        for c, points in zip(classes[kept[:, j]].tolist(), own)]
                (labels_dir / f"{name}.txt").write_text("".join(f"{row}\n" for row in rows), encoding="utf-8")
    yaml_path = out / "data.yaml"
    yaml_path.write_text(yaml.safe_dump({"path": ".", "train": "images/train", "val": "images/val",
                                         "names": dict(enumerate(source.names))}, sort_keys=False), encoding="utf-8")
    return yaml_path
