"""Training curves (results.png) from results.csv, the first training batches as pictures, and the training
labels' statistics (labels.jpg)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch

from ..data.check import save_class_counts, save_label_stats
from ..draw import draw_batch

# The first batches of a run drawn as train_batch0.jpg ... (the reference draws three).
TRAIN_BATCH_PLOTS = 3


def save_train_batch(path: Path, imgs: torch.Tensor, targets: torch.Tensor, names: Sequence[str],
                     masks: torch.Tensor | None = None, overlap: bool = True) -> Path:
    """``path`` (a JPEG): the batch as the model saw it, with its labels' boxes and names and, for a
    segmentation batch, its target masks (see :func:`yolotrain.draw.draw_batch`)."""
    cv2.imwrite(str(path), draw_batch(imgs, targets, names, masks, overlap))
    return path


def save_labels(path: Path, labels: Sequence[np.ndarray] | np.ndarray, names: Sequence[str], classify: bool) -> Path:
    """``path`` (labels.jpg): the training labels as the reference plots them at the start of a run, drawn as
    ``yolotrain data check`` draws them: for detection and segmentation, instances per class, box centres and
    box sizes (``labels``: one ``[n, 5]`` array of class, cx, cy, w, h per image); for classification, the
    images of each class (``labels``: the class of each image)."""
    if classify:
        counts = np.bincount(np.asarray(labels, np.int64), minlength=len(names))
        return save_class_counts({"train": counts}, list(names), path)
    return save_label_stats(list(labels), list(names), path)


def plot_results(csv_path: Path, out_path: Path) -> None:
    """One panel per logged quantity (losses, metrics, learning rates) against the epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    columns = [c for c in rows[0] if c != "epoch"]
    epochs = [int(r["epoch"]) for r in rows]
    ncols = 5
    nrows = -(-len(columns) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3 * ncols, 2.6 * nrows), squeeze=False)
    for ax, column in zip(axes.flat, columns):
        values = [float(r[column]) if r.get(column) else float("nan") for r in rows]
        ax.plot(epochs, values, marker=".", linewidth=1.5)
        ax.set_title(column, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(columns):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
