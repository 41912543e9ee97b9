"""The label masks of a validation batch, for data loaders whose batches carry none.

A segmentation data loader's batches (:class:`~yolotrain.data.segment.SegmentBatch`) carry the masks of
its labels; a detection loader over a YOLO-seg dataset (one a caller built for boxes) yields boxes only.
For those, :func:`batch_label_masks` reads each image's polygons from its label file and rasterises
them in the batch's letterbox geometry as the segmentation loader does
(:func:`~yolotrain.data.segment.polygon_masks`: overlap masks at 1/4 of the input, largest instance
first), returned per label in the order of the batch's targets.
"""

from __future__ import annotations

import numpy as np
import torch

from ..data.segment import polygon_masks
from ..data.sources import img2label_path
from .masks import split_overlap_mask

# Downsampling of label masks against the network input: the prototypes' resolution.
MASK_RATIO = 4
# A label row and a polygon row are the same instance when their boxes differ by less than this
# (normalised): verification clips boxes to the image, so they need not be equal.
_SAME_BOX = 1e-3


def read_polygons(label_file, labels: np.ndarray) -> list[np.ndarray]:
    """The normalised ``(k, 2)`` polygon of each of an image's verified ``labels`` (class, cx, cy, w, h)
    from its YOLO-seg label file; a label whose row has no polygon (a box row) gets its box's corners.

    Verification may drop or clip rows, so each label takes the first unused row of its class whose
    polygon's bounding box is its box.
    """
    rows = []
    try:
        text = label_file.read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        values = np.array(line.split(), dtype=np.float64) if line.split() else np.zeros(0)
        if values.size >= 7 and values.size % 2 == 1:
            rows.append((values[0], values[1:].reshape(-1, 2)))
    polygons, used = [], np.zeros(len(rows), bool)
    for cls, cx, cy, w, h in np.asarray(labels, dtype=np.float64).reshape(-1, 5):
        box = np.array((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
        found = None
        for j, (row_cls, polygon) in enumerate(rows):
            if used[j] or row_cls != cls:
                continue
            bounds = np.concatenate((polygon.min(0), polygon.max(0))).clip(0, 1)
            if np.abs(bounds - box).max() < _SAME_BOX:
                found = j
                break
        if found is None:
            polygons.append(box[[0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 2))
        else:
            used[found] = True
            polygons.append(rows[found][1])
    return polygons


def batch_label_masks(dataset, first: int, count: int, input_hw: tuple[int, int], resized: np.ndarray,
                      pads: np.ndarray, ratio: int = MASK_RATIO) -> list[torch.Tensor]:
    """Per image of the batch (dataset indices ``first`` .. ``first + count - 1``), the bool masks
    ``[n_labels, H/ratio, W/ratio]`` of its labels in the order of ``dataset.labels``; ``resized`` (w, h)
    and ``pads`` (left, top) place each image in the ``input_hw`` batch input."""
    out = []
    for i in range(count):
        labels = dataset.labels[first + i]
        polygons = read_polygons(img2label_path(dataset.im_files[first + i]), labels)
        in_pixels = [p * resized[i] + pads[i] for p in polygons]
        overlap, order = polygon_masks(input_hw, in_pixels, ratio, overlap=True)
        by_area = split_overlap_mask(torch.from_numpy(overlap[0].astype(np.int64)), len(polygons))
        masks = torch.empty_like(by_area)
        masks[torch.from_numpy(order)] = by_area
        out.append(masks)
    return out
