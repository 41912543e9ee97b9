"""Training curves (results.png) from results.csv, and the first training batches as pictures."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import cv2
import torch

from ..draw import draw_batch

# The first batches of a run drawn as train_batch0.jpg ... (the reference draws three).
TRAIN_BATCH_PLOTS = 3


def save_train_batch(path: Path, imgs: torch.Tensor, targets: torch.Tensor, names: Sequence[str],
                     masks: torch.Tensor | None = None, overlap: bool = True) -> Path:
    """``path`` (a JPEG): the batch as the model saw it, with its labels' boxes and names and, for a
    segmentation batch, its target masks (see :func:`yolotrain.draw.draw_batch`)."""
    cv2.imwrite(str(path), draw_batch(imgs, targets, names, masks, overlap))
    return path


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
