"""Sliced inference on small objects in large images: the official yolov5n validated on a generated set, the
whole image at the default 640 px, the whole image at its own resolution, and sliced into 640 px tiles.

The set: coco128's labelled objects (at least 32 px on their short side) cut out and pasted, their long side
shrunk to 16 to 48 px, at random free places of canvases 2560 px wide and 1280 to 2560 px high, whose
background is another coco128 image blurred until no object is left in it. It is written in YOLO format with its
data YAML to a temporary folder (``--keep`` keeps it, and says where).

    python benchmarks/bench_slice.py             # 12 images of 40 objects; a few minutes on 2 CPU cores
    python benchmarks/bench_slice.py --images 4 --objects 20 --no-save   # a quick check that it runs

It prints mAP50, mAP50-95 and the seconds of each ``val`` run, and writes them to ``results/slice.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import torch
import yaml
from common import COCO128, ROOT, YOLOV5N

from yolotrain.eval import val

CANVAS_WIDTH = 2560
CANVAS_HEIGHTS = (1280, 2560)
OBJECT_SIDES = (16, 48)  # the pasted objects' long side, px
MIN_SOURCE_SIDE = 32  # objects cut only where their short side has at least this many px
TILE, OVERLAP = 640, 0.2


def source_objects(coco128: Path) -> list[tuple[Path, int, tuple[int, int, int, int]]]:
    """Every labelled coco128 object large enough to shrink: (image, class, (x1, y1, x2, y2) px)."""
    objects = []
    for image_path in sorted((coco128 / "images" / "train2017").glob("*.jpg")):
        label_path = coco128 / "labels" / "train2017" / f"{image_path.stem}.txt"
        if not label_path.is_file():
            continue
        h, w = cv2.imread(str(image_path)).shape[:2]
        for row in label_path.read_text().split("\n"):
            if not row.strip():
                continue
            c, cx, cy, bw, bh = (float(v) for v in row.split()[:5])
            box = (round((cx - bw / 2) * w), round((cy - bh / 2) * h), round((cx + bw / 2) * w),
                   round((cy + bh / 2) * h))
            if min(box[2] - box[0], box[3] - box[1]) >= MIN_SOURCE_SIDE:
                objects.append((image_path, int(c), box))
    return objects


def build_dataset(root: Path, coco128: Path, images: int, objects_per_image: int, seed: int) -> Path:
    """Write the small-object set under ``root`` (images/val, labels/val) and return its data YAML."""
    rng = np.random.default_rng(seed)
    objects = source_objects(coco128)
    backgrounds = sorted((coco128 / "images" / "train2017").glob("*.jpg"))
    (root / "images" / "val").mkdir(parents=True)
    (root / "labels" / "val").mkdir(parents=True)
    decoded: dict[Path, np.ndarray] = {}
    for n in range(images):
        height = int(rng.integers(CANVAS_HEIGHTS[0] // 32, CANVAS_HEIGHTS[1] // 32 + 1)) * 32
        background = cv2.imread(str(backgrounds[rng.integers(len(backgrounds))]))
        canvas = cv2.GaussianBlur(cv2.resize(background, (CANVAS_WIDTH, height)), (0, 0), 40)
        taken = np.zeros((height, CANVAS_WIDTH), bool)
        rows = []
        for index in rng.choice(len(objects), objects_per_image, replace=False):
            path, cls, (x1, y1, x2, y2) = objects[index]
            image = decoded.setdefault(path, cv2.imread(str(path)))
            crop = image[y1:y2, x1:x2]
            side = int(rng.integers(OBJECT_SIDES[0], OBJECT_SIDES[1] + 1))
            scale = side / max(crop.shape[:2])
            w, h = max(round(crop.shape[1] * scale), 2), max(round(crop.shape[0] * scale), 2)
            for _ in range(50):  # a free place, a few px away from the others
                left, top = int(rng.integers(0, CANVAS_WIDTH - w)), int(rng.integers(0, height - h))
                if not taken[max(top - 4, 0):top + h + 4, max(left - 4, 0):left + w + 4].any():
                    break
            else:
                continue
            taken[top:top + h, left:left + w] = True
            canvas[top:top + h, left:left + w] = cv2.resize(crop, (w, h), interpolation=cv2.INTER_AREA)
            rows.append(f"{cls} {(left + w / 2) / CANVAS_WIDTH:.6f} {(top + h / 2) / height:.6f} "
                        f"{w / CANVAS_WIDTH:.6f} {h / height:.6f}")
        cv2.imwrite(str(root / "images" / "val" / f"small{n:03d}.jpg"), canvas, [cv2.IMWRITE_JPEG_QUALITY, 95])
        (root / "labels" / "val" / f"small{n:03d}.txt").write_text("\n".join(rows) + "\n")
    names = yaml.safe_load((coco128 / "data.yaml").read_text())["names"]
    data = root / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/val", "val": "images/val", "names": names}))
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--objects", type=int, default=40, help="objects pasted per image")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the generated dataset")
    parser.add_argument("--no-save", action="store_true", help="do not write results/slice.json")
    args = parser.parse_args()

    runs = {  # name → val settings
        "whole image at 640 (default)": {"img_size": 640},
        f"whole image at {CANVAS_WIDTH}": {"img_size": CANVAS_WIDTH},
        f"sliced: {CANVAS_WIDTH}, --slice {TILE} --slice-overlap {OVERLAP}": {
            "img_size": CANVAS_WIDTH, "slice": TILE, "slice_overlap": OVERLAP},
    }
    folder = tempfile.mkdtemp(prefix="small-objects-") if args.keep else None
    with tempfile.TemporaryDirectory(prefix="small-objects-") as temporary:
        root = Path(folder or temporary)
        data = build_dataset(root / "data", COCO128, args.images, args.objects, args.seed)
        labels = sum(len(p.read_text().split()) // 5 for p in (root / "data" / "labels" / "val").glob("*.txt"))
        print(f"{args.images} images, {labels} objects of {OBJECT_SIDES[0]}-{OBJECT_SIDES[1]} px: {data}")
        rows = []
        for name, settings in runs.items():
            start = time.perf_counter()
            metrics = val(str(YOLOV5N), data, device="cpu", half=False, batch_size=args.batch_size, workers=0,
                          plots=False, verbose=False, **settings)
            seconds = time.perf_counter() - start
            rows.append({"run": name, **settings, "mAP50": round(metrics.map50, 4), "mAP50-95": round(metrics.map, 4),
                         "seconds": round(seconds, 1)})
            print(f"{name}: mAP50 {metrics.map50:.3f}, mAP50-95 {metrics.map:.3f}, {seconds:.0f} s")
        if folder:
            print(f"dataset kept in {folder}")
    print("\n| run | mAP50 | mAP50-95 | val seconds (CPU) |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['run']} | {row['mAP50']:.3f} | {row['mAP50-95']:.3f} | {row['seconds']:.0f} |")
    if not args.no_save:
        result = {"images": args.images, "objects": labels, "object_sides": OBJECT_SIDES, "seed": args.seed,
                  "weights": YOLOV5N.name, "torch": torch.__version__,
                  "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(), "runs": rows}
        (ROOT / "benchmarks" / "results" / "slice.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
