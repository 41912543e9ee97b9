"""Dataset check: verification summary, a preview of augmented training samples with their boxes (and
masks, for polygon labels), and label statistics (class counts, box sizes)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import cv2
import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import numpy as np
import torch

from ..boxes import xywh_to_xyxy
from ..draw import draw_detections, draw_masks, object_masks
from ..outputs import dataset_inputs, refuse_overwriting_inputs
from .augment import AugmentConfig
from .dataset import DetectionDataset
from .loaders import DataConfig, build_loaders
from .verify import DataWarning, VerifyReport


@dataclass
class CheckResult:
    """Verification reports of both splits and the written image files."""

    train: VerifyReport
    val: VerifyReport
    preview: Path
    stats: Path


def draw_sample(img_rgb: np.ndarray, labels: np.ndarray, names: list[str],
                masks: np.ndarray | None = None, overlap: bool = True) -> np.ndarray:
    """A BGR copy of a dataset sample with its labels (class + normalised cx, cy, w, h) drawn and named, and
    a segmentation sample's target masks (``overlap``: a ``[1, h, w]`` numbered map, else ``[n, h, w]``)
    blended in their class colours."""
    h, w = img_rgb.shape[:2]
    image = cv2.cvtColor(img_rgb, cv2.COLOR_RGB2BGR)
    if masks is not None:
        image = draw_masks(image, object_masks(masks, len(labels), (h, w), overlap), labels[:, 0])
    boxes = xywh_to_xyxy(torch.from_numpy(labels[:, 1:5]).double()) * torch.tensor([w, h, w, h])
    return draw_detections(image, boxes, labels[:, 0], names)


def save_preview(dataset: DetectionDataset, path: Path, n: int = 4) -> Path:
    """Write a grid of the first ``n`` (augmented) samples of ``dataset`` with boxes and names (and masks,
    for a :class:`~yolotrain.data.segment.SegmentationDataset`)."""
    samples = [dataset[i % len(dataset)] for i in range(n)]
    overlap = getattr(dataset, "overlap", True)
    tiles = [draw_sample(s[0], s[1], dataset.names, s[4] if len(s) == 5 else None, overlap) for s in samples]
    size = dataset.img_size
    tiles = [cv2.resize(t, (size, size)) if t.shape[:2] != (size, size) else t for t in tiles]
    cols = int(np.ceil(np.sqrt(n)))
    rows = -(-n // cols)
    tiles += [np.full_like(tiles[0], 114)] * (rows * cols - n)
    grid = np.vstack([np.hstack(tiles[r * cols:(r + 1) * cols]) for r in range(rows)])
    cv2.imwrite(str(path), grid)
    return path


def save_label_stats(labels: list[np.ndarray], names: list[str], path: Path) -> Path:
    """Plot class counts and the box width/height distribution (normalised) to ``path``."""
    all_labels = np.concatenate(labels) if labels else np.zeros((0, 5))
    nc = max(len(names), int(all_labels[:, 0].max()) + 1 if len(all_labels) else 1)
    counts = np.bincount(all_labels[:, 0].astype(int), minlength=nc)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.bar(np.arange(nc), counts, color="#4c72b0")
    ax1.set_title(f"boxes per class ({len(all_labels)} boxes)")
    ax1.set_ylabel("boxes")
    if nc <= 30:
        ax1.set_xticks(np.arange(nc), [names[i] if i < len(names) else str(i) for i in range(nc)],
                      rotation=60, ha="right", fontsize=8)
    ax2.hist2d(all_labels[:, 3], all_labels[:, 4], bins=40, range=[[0, 1], [0, 1]], cmap="Blues")
    ax2.set_title("box width vs height (fraction of image)")
    ax2.set_xlabel("width")
    ax2.set_ylabel("height")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def check_dataset(
    data: str | os.PathLike, out_dir: str | os.PathLike, num_classes: int | None = None, img_size: int = 640,
    seed: int = 0,
) -> CheckResult:
    """Verify a dataset (folder or YAML), print the summary of each split, and write
    ``mosaic_preview.png`` (augmented training samples with boxes and class names, and masks for polygon
    labels) and ``label_stats.png`` (class counts, box w/h distribution) into ``out_dir``.

    ``num_classes`` defaults to the number of class names in the dataset; without names, class ids
    are not range-checked.
    """
    out = Path(out_dir)
    config = DataConfig(path=os.fspath(data), img_size=img_size, batch_size=1, workers=0, cache_mb=0)
    with warnings.catch_warnings():  # the summaries are printed below; no need to repeat them as warnings
        warnings.simplefilter("ignore", DataWarning)
        loaders = build_loaders(config, AugmentConfig(), num_classes=num_classes, seed=seed)
    train, val = loaders.train_index, loaders.val_index
    refuse_overwriting_inputs([("--out", out)], dataset_inputs([*train.files, *val.files], data))
    out.mkdir(parents=True, exist_ok=True)
    print(train.report.summary("train"))
    if val is not train:
        print(val.report.summary("val"))
    preview_set = loaders.train.dataset
    if train.has_polygons:  # a YOLO-seg dataset: the preview shows the masks its training draws
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DataWarning)
            preview_set = build_loaders(config, AugmentConfig(), num_classes=num_classes, seed=seed, splits=("train",),
                                        masks=True).train.dataset
    preview = save_preview(preview_set, out / "mosaic_preview.png")
    stats = save_label_stats(train.labels, loaders.names, out / "label_stats.png")
    print(f"wrote {preview} and {stats}")
    return CheckResult(train.report, val.report, preview, stats)
