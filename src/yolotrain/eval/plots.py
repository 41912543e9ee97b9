"""Pictures of results: the confusion matrix and P/R/F1/PR curves as PNGs (matplotlib, Agg), and the first
validation batches with their labels and with the model's predictions (``val_batch{0,1,2}_labels.jpg`` and
``_pred.jpg``, the reference's). Boxes drawn onto images live in :mod:`yolotrain.draw`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch

from ..data.check import draw_class_sample
from ..draw import draw_batch, tile_grid
from .masks import process_masks
from .metrics import ConfusionMatrix, Metrics

# Past this many classes per-class legends and cell annotations become unreadable.
MAX_LABELLED_CLASSES = 30
# The first validation batches drawn as val_batch0_labels.jpg / val_batch0_pred.jpg ... (the reference's three).
VAL_BATCH_PLOTS = 3
# Detections below this score are left out of the prediction pictures, as the reference's plot_images does.
PLOT_CONF = 0.25


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    return plt


def plot_confusion_matrix(cm: ConfusionMatrix, names: Sequence[str], path: str | os.PathLike) -> Path:
    """Column-normalised confusion matrix (each true class sums to 1) with a background row/column."""
    labels = [*names, "background"] if cm.nc < MAX_LABELLED_CLASSES else None
    return plot_normalised_matrix(cm.matrix, labels, path)


def plot_normalised_matrix(matrix: np.ndarray, labels: Sequence[str] | None, path: str | os.PathLike) -> Path:
    """A confusion matrix (rows predicted, columns true) normalised per true class, near-zero cells blank;
    ``labels`` name the rows and columns and their cells are annotated (None: too many to read)."""
    plt = _pyplot()
    m = matrix.astype(np.float64)
    norm = m / (m.sum(0, keepdims=True) + 1e-9)
    shown = np.where(norm < 0.005, np.nan, norm)  # leave near-zero cells blank
    fig, ax = plt.subplots(figsize=(12, 9), tight_layout=True)
    fig.colorbar(ax.imshow(shown, cmap="Blues", vmin=0, vmax=1), ax=ax)
    if labels is not None:
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        for r, c in zip(*np.nonzero(~np.isnan(shown))):
            ax.text(c, r, f"{shown[r, c]:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if shown[r, c] > 0.5 else "black")
    ax.set_xlabel("True")
    ax.set_ylabel("Predicted")
    ax.set_title("Confusion Matrix")
    path = Path(path)
    fig.savefig(path, dpi=200)
    plt.close(fig)
    return path


def _curve_plot(px: np.ndarray, ys: np.ndarray, labels: list[str], mean_label: str, xlabel: str, ylabel: str,
                path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 6), tight_layout=True)
    per_class_legend = 0 < len(labels) < MAX_LABELLED_CLASSES
    for y, label in zip(ys, labels):
        ax.plot(px, y, linewidth=1, label=label if per_class_legend else None, color="grey" if not per_class_legend
                else None)
    ax.plot(px, ys.mean(0), linewidth=3, color="blue", label=mean_label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left")
    fig.savefig(path, dpi=200)
    plt.close(fig)
    return path


def plot_curves(metrics: Metrics, save_dir: str | os.PathLike) -> list[Path]:
    """PR_curve.png (at IoU 0.5), F1_curve.png, P_curve.png and R_curve.png in ``save_dir``."""
    c = metrics.curves
    save_dir = Path(save_dir)
    names = [metrics.names[k] for k in metrics.classes]
    best = int(c.f1.mean(0).argmax())
    return [
        _curve_plot(c.px, c.pr, [f"{n} {a:.3f}" for n, a in zip(names, metrics.ap50)],
                    f"all classes {metrics.map50:.3f} mAP@0.5", "Recall", "Precision", save_dir / "PR_curve.png"),
        _curve_plot(c.px, c.f1, names, f"all classes {c.f1.mean(0)[best]:.2f} at {c.px[best]:.3f}",
                    "Confidence", "F1", save_dir / "F1_curve.png"),
        _curve_plot(c.px, c.precision, names, "all classes", "Confidence", "Precision", save_dir / "P_curve.png"),
        _curve_plot(c.px, c.recall, names, "all classes", "Confidence", "Recall", save_dir / "R_curve.png"),
    ]


def save_val_batch(save_dir: Path, index: int, imgs: torch.Tensor, targets: torch.Tensor, dets: list[torch.Tensor],
                   names: Sequence[str], masks: torch.Tensor | None = None, overlap: bool = True,
                   protos: torch.Tensor | None = None, label_keypoints: torch.Tensor | None = None,
                   kpt_shape: tuple[int, int] | None = None) -> tuple[Path, Path]:
    """``val_batch{index}_labels.jpg`` and ``val_batch{index}_pred.jpg`` in ``save_dir``: the batch ``imgs``
    (RGB, uint8 or floats in 0..1) drawn as training batches are (:func:`yolotrain.draw.draw_batch`), once with
    its ``targets`` (and label ``masks``, as a segmentation batch carries them) and once with the detections
    scoring at least :data:`PLOT_CONF` (``dets`` per image: xyxy in the batch's pixels, score, class, then a
    segmentation model's mask coefficients, whose masks are made from ``protos``, or a pose model's ``kpt_shape``
    keypoints, drawn as the labels' ``label_keypoints`` rows are)."""
    h, w = imgs.shape[-2:]
    labels_path = save_dir / f"val_batch{index}_labels.jpg"
    cv2.imwrite(str(labels_path), draw_batch(imgs, targets.cpu(), names, masks, overlap, keypoints=label_keypoints))
    rows, pred_masks, pred_keypoints = [], [], []
    scale = torch.tensor([w, h, w, h], dtype=torch.float64)
    for i, det in enumerate(dets):
        det = det[det[:, 4] >= PLOT_CONF].detach().double().cpu()
        xyxy = det[:, :4] / scale
        xywh = torch.cat(((xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]), 1)
        rows.append(torch.cat((torch.full((len(det), 1), float(i), dtype=torch.float64), det[:, 5:6], xywh,
                               det[:, 4:5]), 1))
        if protos is not None:
            kept = det.to(protos.device, protos.dtype)
            pred_masks.append(process_masks(protos[i], kept[:, 6:], kept[:, :4], (h, w)).cpu())
        if kpt_shape is not None:  # normalised as the labels' keypoints are
            points = det[:, 6:].reshape(len(det), *kpt_shape).clone()
            points[..., 0] /= w
            points[..., 1] /= h
            pred_keypoints.append(points)
    pred_path = save_dir / f"val_batch{index}_pred.jpg"
    cv2.imwrite(str(pred_path), draw_batch(imgs, torch.cat(rows), names,
                                           torch.cat(pred_masks) if protos is not None else None, overlap=False,
                                           keypoints=torch.cat(pred_keypoints) if kpt_shape is not None else None))
    return labels_path, pred_path


def save_classify_val_batch(save_dir: Path, index: int, imgs: torch.Tensor, labels: torch.Tensor,
                            logits: torch.Tensor, names: Sequence[str], max_images: int = 16) -> tuple[Path, Path]:
    """``val_batch{index}_labels.jpg`` and ``val_batch{index}_pred.jpg`` of a classifier's batch: its first
    ``max_images`` normalised images (as the loader makes them) in a grid, named with their true class, and with
    the model's top-1 class and probability."""
    n = min(len(imgs), max_images)
    images, labels = imgs[:n].detach().float().cpu(), labels[:n].cpu().tolist()
    probs, top1 = logits[:n].detach().float().softmax(1).cpu().max(1)
    labels_path = save_dir / f"val_batch{index}_labels.jpg"
    cv2.imwrite(str(labels_path),
                tile_grid([draw_class_sample(image, names[c], c) for image, c in zip(images, labels)]))
    pred_path = save_dir / f"val_batch{index}_pred.jpg"
    cv2.imwrite(str(pred_path), tile_grid([draw_class_sample(image, f"{names[c]} {p:.2f}", c)
                                           for image, c, p in zip(images, top1.tolist(), probs.tolist())]))
    return labels_path, pred_path
