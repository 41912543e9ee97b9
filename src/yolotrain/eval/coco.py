"""COCO-format export and evaluation: ground truth built from YOLO labels, detections as COCO
results, and the official 12-number summary from ``pycocotools``."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

COCO_STAT_NAMES = (
    "AP@[.50:.95] all", "AP@.50 all", "AP@.75 all", "AP@[.50:.95] small", "AP@[.50:.95] medium",
    "AP@[.50:.95] large", "AR@[.50:.95] maxDets=1", "AR@[.50:.95] maxDets=10", "AR@[.50:.95] maxDets=100",
    "AR@[.50:.95] small", "AR@[.50:.95] medium", "AR@[.50:.95] large",
)


def image_ids(files: Sequence[str | os.PathLike]) -> list[int]:
    """COCO image ids: the numeric file stems when all are numeric and distinct (so results match
    official COCO annotations), else positions 0..n-1."""
    stems = [Path(f).stem for f in files]
    if all(s.isdigit() for s in stems) and len({int(s) for s in stems}) == len(stems):
        return [int(s) for s in stems]
    return list(range(len(stems)))


def coco_ground_truth(files: Sequence[str | os.PathLike], labels: Sequence[np.ndarray], shapes: np.ndarray,
                      names: Sequence[str], polygons: Sequence[Sequence[np.ndarray]] | None = None,
                      keypoints: Sequence[np.ndarray] | None = None) -> dict:
    """A COCO ``instances`` dict from YOLO labels.

    Args:
        files: image paths, in dataset order.
        labels: per image ``(n, 5)`` class, cx, cy, w, h normalised to the image.
        shapes: per image original (w, h) in pixels.
        names: class names; category ids are the class indices.
        polygons: per image, each label's normalised ``(k, 2)`` polygon: written as its ``segmentation``
            (and its area is the polygon's), so ``segm`` evaluation can run.
        keypoints: per image, its labels' ``(n, K, 3)`` keypoints (x, y normalised, visibility 0/1/2): written as
            each label's ``keypoints`` and ``num_keypoints`` (those labelled), so ``keypoints`` evaluation can run.
    """
    ids = image_ids(files)
    images, annotations = [], []
    outlines = polygons if polygons is not None else [None] * len(ids)
    points = keypoints if keypoints is not None else [None] * len(ids)
    for image_id, f, lb, (w, h), image_polygons, image_points in zip(ids, files, labels,
                                                                     np.asarray(shapes).reshape(-1, 2), outlines,
                                                                     points):
        images.append({"id": image_id, "file_name": Path(f).name, "width": int(w), "height": int(h)})
        lb = np.asarray(lb, dtype=np.float64).reshape(-1, 5)
        bw, bh = lb[:, 3] * w, lb[:, 4] * h
        x1, y1 = lb[:, 1] * w - bw / 2, lb[:, 2] * h - bh / 2
        for k, (c, *box) in enumerate(zip(lb[:, 0].astype(int).tolist(), x1.tolist(), y1.tolist(), bw.tolist(),
                                          bh.tolist())):
            annotation = {"id": len(annotations) + 1, "image_id": image_id, "category_id": c,
                          "bbox": [round(v, 3) for v in box], "area": box[2] * box[3], "iscrowd": 0}
            if image_polygons is not None:
                points = np.asarray(image_polygons[k], np.float64).reshape(-1, 2) * (w, h)
                annotation["segmentation"] = [[round(v, 2) for v in points.reshape(-1).tolist()]]
                x, y = points[:, 0], points[:, 1]
                annotation["area"] = float(abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))) / 2)
            if image_points is not None:
                label_points = np.asarray(image_points[k], np.float64).reshape(-1, 3) * (w, h, 1)
                label_points[label_points[:, 2] == 0] = 0  # COCO's unlabelled keypoint: 0, 0, 0
                annotation["keypoints"] = [round(v, 2) for v in label_points.reshape(-1).tolist()]
                annotation["num_keypoints"] = int((label_points[:, 2] > 0).sum())
            annotations.append(annotation)
    categories = [{"id": i, "name": n} for i, n in enumerate(names)]
    return {"images": images, "annotations": annotations, "categories": categories}


def detections_to_coco(detections: torch.Tensor, image_id: int) -> list[dict]:
    """COCO results for one image: ``detections [n, 6]`` (x1, y1, x2, y2 original pixels, score, class)."""
    d = detections.double()
    xywh = torch.cat((d[:, :2], d[:, 2:4] - d[:, :2]), 1).tolist()
    return [{"image_id": image_id, "category_id": int(c), "bbox": [round(v, 3) for v in box], "score": round(s, 5)}
            for box, s, c in zip(xywh, d[:, 4].tolist(), d[:, 5].tolist())]


def coco_evaluate(gt_json: str | os.PathLike, pred_json: str | os.PathLike, verbose: bool = True,
                  iou_type: str = "bbox", keypoint_sigmas: Sequence[float] | None = None) -> list[float]:
    """Evaluate COCO-format detections against ground truth by their boxes (``iou_type`` ``bbox``), their
    masks (``segm``: detections with RLE ``segmentation``, ground truth with polygons) or their keypoints
    (``keypoints``: OKS with ``keypoint_sigmas``, one per keypoint; COCO's 17 person ones by default); returns
    the COCO summary numbers (12; 10 for keypoints, which have no small objects).

    Raises:
        ImportError: ``pycocotools`` is not installed.
    """
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError as exc:
        raise ImportError("COCO evaluation needs pycocotools: pip install pycocotools") from exc
    if not json.loads(Path(pred_json).read_text()):  # no detections at all: every number is zero
        return [0.0] * len(COCO_STAT_NAMES)
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools narrates loading; keep only the summary
        gt = COCO(str(gt_json))
        dt = gt.loadRes(str(pred_json))
    evaluator = COCOeval(gt, dt, iou_type)
    if keypoint_sigmas is not None:
        evaluator.params.kpt_oks_sigmas = np.asarray(keypoint_sigmas, np.float64)
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    if verbose:
        print("\n".join(line for line in summary.getvalue().splitlines() if line.lstrip().startswith("Average")))
    return [float(v) for v in evaluator.stats]
