"""Classification evaluation: top-1/top-5 accuracy, per-class table, confusion matrix and validation loss
(the reference's ``classify/val.py``). :func:`yolotrain.val` comes here for a model whose ``task`` is
``"classify"``; its predictions are :mod:`yolotrain.prediction.classify`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..callbacks import Callbacks
from ..data.classify import ClassifyLoaders, build_classify_loaders
from ..detector import Detector
from ..interop.loading.resolve import weights_inputs
from ..outputs import refuse_overwriting_inputs
from ..progress import progress_bar
from ..runs import run_lock
from .plots import MAX_LABELLED_CLASSES, VAL_BATCH_PLOTS, plot_normalised_matrix, save_classify_val_batch

# The reference's top-k: accuracy top-1 and top-5, and the five classes a prediction lists.
TOP_K = 5
# Width of the class column of the results table (the reference's).
TABLE_WIDTH = 24


@dataclass
class ClassifyMetrics:
    """Validation results of a classifier: accuracies over all images and per class, the confusion matrix
    ``[nc, nc]`` (rows: predicted top-1 class, columns: true class), the mean loss when a criterion was given,
    and speeds (ms per image)."""

    top1: float
    top5: float
    names: list[str]
    images: np.ndarray  # [nc] images of each class
    class_top1: np.ndarray  # [nc] (nan for a class without images)
    class_top5: np.ndarray
    confusion: np.ndarray
    loss: float | None = None
    speed: dict[str, float] = field(default_factory=dict)

    def fitness(self) -> float:
        """What training keeps the best checkpoint by: top-1 accuracy, as the reference's classify recipe."""
        return self.top1

    def table(self, per_class: bool = True) -> str:
        """The reference's verbose table: class, images, top-1 and top-5 accuracy."""
        rows = [f"{'Class':>{TABLE_WIDTH}}{'Images':>12}{'top1_acc':>12}{'top5_acc':>12}",
                f"{'all':>{TABLE_WIDTH}}{int(self.images.sum()):>12}{self.top1:>12.3g}{self.top5:>12.3g}"]
        if per_class:
            rows += [f"{name:>{TABLE_WIDTH}}{int(n):>12}{t1:>12.3g}{t5:>12.3g}"
                     for name, n, t1, t5 in zip(self.names, self.images, self.class_top1, self.class_top5) if n]
        return "\n".join(rows)


def accuracy_metrics(logits_top: torch.Tensor, labels: torch.Tensor, names: Sequence[str]) -> ClassifyMetrics:
    """Metrics from each image's top-k class indices ``[N, k]`` (best first) and true classes ``[N]``."""
    nc = len(names)
    correct = labels[:, None] == logits_top
    top1, top5 = correct[:, 0].double(), correct.any(1).double()
    images = torch.bincount(labels, minlength=nc).double()
    with np.errstate(invalid="ignore", divide="ignore"):
        class_top1 = (torch.bincount(labels, top1, minlength=nc) / images).numpy()
        class_top5 = (torch.bincount(labels, top5, minlength=nc) / images).numpy()
    confusion = torch.bincount(logits_top[:, 0] * nc + labels, minlength=nc * nc).view(nc, nc).numpy()
    return ClassifyMetrics(float(top1.mean()) if len(labels) else 0.0, float(top5.mean()) if len(labels) else 0.0,
                           list(names), images.long().numpy(), class_top1, class_top5, confusion)


def plot_classify_confusion(matrix: np.ndarray, names: Sequence[str], path: str | os.PathLike) -> Path:
    """The confusion matrix normalised per true class (each column sums to 1) as a PNG."""
    return plot_normalised_matrix(matrix, names if len(names) < MAX_LABELLED_CLASSES else None, path)


def classify_val_loader(data: str | os.PathLike, names: Sequence[str], img_size: int, batch_size: int,
                        workers: int | None) -> DataLoader:
    """The evaluated split (``test/`` when present, else ``val/``) of an ImageNet-style folder, its classes
    numbered as the model's names (a class folder the model does not know is an error); a model without
    names (numbered ``0``, ``1`` ...) takes the folders in sorted order, as the reference does.

    Raises:
        ValueError: a model without names whose class count is not the number of class folders.
    """
    numbered = list(names) == [str(i) for i in range(len(names))]
    loaders: ClassifyLoaders = build_classify_loaders(data, img_size, batch_size, splits=("val",),
                                                      names=None if numbered else names, workers=workers)
    if numbered and len(loaders.names) != len(names):
        raise ValueError(f"{data}: {len(loaders.names)} class folders for a model of {len(names)} classes "
                         "(it has no class names to match them by)")
    return loaders.val


def val_classifier(model: Detector, data: str | os.PathLike | DataLoader, device: torch.device, *,
                   img_size: int | None = None, batch_size: int = 32, workers: int | None = None,
                   criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                   save_dir: str | os.PathLike | None = None, plots: bool = True, verbose: bool = True,
                   weights: str | os.PathLike | None = None, hooks: Callbacks | None = None) -> ClassifyMetrics:
    """Top-1/top-5 accuracy of a classifier ready for inference (see :func:`yolotrain.val`) on ``data``: an
    ImageNet-style folder or a loader of :func:`~yolotrain.data.classify.build_classify_loaders`.

    ``criterion(logits, labels)`` (cross-entropy in training) gives ``metrics.loss``, the mean over batches as
    the reference reports it. With ``save_dir`` (and ``plots``) the confusion matrix is drawn there, and the first
    three batches as ``val_batch{0,1,2}_labels.jpg`` (true classes) and ``_pred.jpg`` (top-1 classes).
    """
    hooks = hooks or Callbacks()
    if isinstance(data, DataLoader):
        loader = data
    else:
        loader = classify_val_loader(data, model.names, img_size or model.default_img_size, batch_size, workers)
    names = list(getattr(loader.dataset, "names", None) or model.names)
    out_dir = Path(save_dir) if save_dir is not None else None
    if out_dir is not None:
        files = getattr(loader.dataset, "files", ())
        inputs = (weights_inputs(weights) if weights is not None else []) + [
            ("dataset images", folder) for folder in sorted({Path(f).parent for f in files})]
        refuse_overwriting_inputs([("--project/--name", out_dir)], inputs)
    with run_lock(out_dir):  # one writer per run folder, until its results are written
        tops, labels, loss_sum, batches, seen = [], [], 0.0, 0, 0
        timers = {"preprocess": 0.0, "inference": 0.0}
        hooks.run("on_val_start", loader)
        with torch.inference_mode():
            clock = _clock(device)
            for batch_index, (imgs, targets) in enumerate(progress_bar(loader, desc="val", unit="batch")):
                imgs, targets = imgs.to(device, model.dtype, non_blocking=True), targets.to(device)
                timers["preprocess"] += clock()
                hooks.run("on_val_batch_start", batch_index, imgs, targets)
                logits = model(imgs)
                timers["inference"] += clock()
                if criterion is not None:
                    loss_sum += float(criterion(logits.float(), targets))
                    batches += 1
                top = logits.float().topk(min(TOP_K, logits.shape[1]), 1).indices
                tops.append(top.cpu())
                labels.append(targets.cpu())
                seen += len(targets)
                if out_dir is not None and plots and batch_index < VAL_BATCH_PLOTS:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    save_classify_val_batch(out_dir, batch_index, imgs, targets, logits, names)
                hooks.run("on_val_batch_end", batch_index, imgs, targets, logits)
                clock()
        metrics = accuracy_metrics(torch.cat(tops), torch.cat(labels), names)
        metrics.speed = {k: v / max(seen, 1) * 1e3 for k, v in timers.items()}
        if criterion is not None:
            metrics.loss = loss_sum / max(batches, 1)
        if verbose:
            print(metrics.table(per_class=len(names) < 50 or out_dir is not None))
            print("Speed: {:.1f}ms pre-process, {:.1f}ms inference per image".format(
                metrics.speed["preprocess"], metrics.speed["inference"]))
        if out_dir is not None and plots:
            out_dir.mkdir(parents=True, exist_ok=True)
            plot_classify_confusion(metrics.confusion, names, out_dir / "confusion_matrix.png")
        hooks.run("on_val_end", metrics)
        return metrics


def _clock(device: torch.device) -> Callable[[], float]:
    """A function giving the seconds since its previous call, waiting for queued GPU work first."""
    last = [time.perf_counter()]

    def tick() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        elapsed, last[0] = now - last[0], now
        return elapsed

    return tick
