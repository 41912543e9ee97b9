"""Convert COCO ``instances_*.json`` annotations into YOLO label files."""

from __future__ import annotations

import json
import os
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np


def coco_to_yolo(
    instances_json: str | os.PathLike, images_dir: str | os.PathLike, out_labels_dir: str | os.PathLike
) -> list[str]:
    """Write one YOLO label file per image of a COCO instances file and return the class names.

    COCO category ids (sparse, e.g. 1..90) map to contiguous ids 0..n-1 in ascending id order.
    Boxes (top-left x, y, w, h in pixels) become normalised (cx, cy, w, h), clipped to the image;
    crowd annotations and empty boxes are skipped. Every image gets a file, empty when it has no
    boxes, so it counts as a background image. Label paths mirror each image's ``file_name``
    under ``out_labels_dir``.

    Raises:
        FileNotFoundError: the JSON file or ``images_dir`` does not exist.
        ValueError: the JSON lacks ``images``, ``annotations`` or ``categories``.
    """
    src, images_dir, out = Path(instances_json), Path(images_dir), Path(out_labels_dir)
    if not src.is_file():
        raise FileNotFoundError(f"COCO annotation file not found: {src}")
    if not images_dir.is_dir():
        raise FileNotFoundError(f"images folder not found: {images_dir}")
    data = json.loads(src.read_text())
    missing_keys = {"images", "annotations", "categories"} - data.keys()
    if missing_keys:
        raise ValueError(f"{src}: not a COCO instances file, missing {', '.join(sorted(missing_keys))}")

    categories = sorted(data["categories"], key=lambda c: c["id"])
    cat_index = {c["id"]: i for i, c in enumerate(categories)}
    per_image: dict[int, list[dict]] = defaultdict(list)
    for ann in data["annotations"]:
        if not ann.get("iscrowd", 0):
            per_image[ann["image_id"]].append(ann)

    missing_images = [im["file_name"] for im in data["images"]
                      if not (images_dir / im["file_name"]).is_file()]
    if missing_images:
        warnings.warn(f"{src}: {len(missing_images)} images not found in {images_dir} "
                      f"(labels written anyway), e.g. {missing_images[0]}", stacklevel=2)

    for im in data["images"]:
        w, h = float(im["width"]), float(im["height"])
        anns = per_image.get(im["id"], [])
        rows = np.zeros((0, 5))
        if anns:
            cls = np.array([cat_index[a["category_id"]] for a in anns], dtype=np.float64)
            xywh = np.array([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4)
            x1 = np.clip(xywh[:, 0], 0, w)
            y1 = np.clip(xywh[:, 1], 0, h)
            x2 = np.clip(xywh[:, 0] + xywh[:, 2], 0, w)
            y2 = np.clip(xywh[:, 1] + xywh[:, 3], 0, h)
            rows = np.stack([cls, (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h], 1)
            rows = rows[(rows[:, 3] > 0) & (rows[:, 4] > 0)]
        label = (out / im["file_name"]).with_suffix(".txt")
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text("".join(f"{int(r[0])} {r[1]:.6f} {r[2]:.6f} {r[3]:.6f} {r[4]:.6f}\n" for r in rows))
    return [c["name"] for c in categories]
