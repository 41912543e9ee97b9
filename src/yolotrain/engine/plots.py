"""Training curves (results.png) from results.csv; how many first training batches are drawn (each task draws
its own: :meth:`yolotrain.task.Task.save_training_batch`)."""

from __future__ import annotations

import csv
from pathlib import Path

# The first batches of a run drawn as train_batch0.jpg ... (the reference draws three).
TRAIN_BATCH_PLOTS = 3


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
