"""Classification evaluation and prediction: top-1/top-5 accuracy, per-class table, confusion matrix and
validation loss (the reference's ``classify/val.py``); the top-5 classes of each image with their
probabilities, written as text and onto the image (its ``classify/predict.py``).

:func:`yolotrain.val` and :func:`yolotrain.predict` come here for a model whose ``task`` is ``"classify"``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader

from ..callbacks import Callbacks
from ..data.classify import ClassifyLoaders, build_classify_loaders, eval_transform
from ..detector import Detector
from ..draw import class_colour
from ..interop.resolve import weights_inputs
from ..outputs import refuse_overwriting_inputs
from ..progress import progress_bar
from ..runs import run_lock
from .plots import MAX_LABELLED_CLASSES, VAL_BATCH_PLOTS, plot_normalised_matrix, save_classify_val_batch
from .result_outputs import ResultOutputs

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


@dataclass
class ClassifyResult(ResultOutputs):
    """Class probabilities of one image or video frame: ``probs`` ``[nc]`` (softmax), ``top5`` the indices of
    the five most probable classes (fewer with fewer classes), best first. ``image`` is the BGR image or
    frame classified, on the results of ``predict(stream=True)`` only, as for detections. ``plot()``,
    ``save(path)``, ``to_json()`` and ``to_df()`` come from :class:`ResultOutputs`."""

    path: str
    probs: torch.Tensor
    names: list[str]
    orig_shape: tuple[int, int]
    frame: int | None = None
    image: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def top5(self) -> list[int]:
        return self.probs.topk(min(TOP_K, len(self.probs))).indices.tolist()

    @property
    def top1(self) -> int:
        return int(self.probs.argmax())

    def lines(self) -> list[str]:
        """``probability name`` of the top five classes, as the reference's ``classify/predict.py`` saves them."""
        return [f"{float(self.probs[i]):.2f} {self.names[i]}" for i in self.top5]

    yolo_lines = lines  # the label file of each image, as detection results write theirs

    def summary(self) -> str:
        """One line: the source and its top five classes with their probabilities."""
        return f"{self.path}: " + ", ".join(f"{self.names[i]} {float(self.probs[i]):.2f}" for i in self.top5)

    @classmethod
    def run_summary(cls, results: list[ClassifyResult]) -> str:
        """Each image's top five, then how many were classified."""
        return "\n".join([*(r.summary() for r in results), f"{len(results)} images/frames classified."])

    def to_dict(self) -> dict:
        out = {"source": self.path, "height": self.orig_shape[0], "width": self.orig_shape[1],
               "top5": [{"class": i, "name": self.names[i], "probability": round(float(self.probs[i]), 5)}
                        for i in self.top5]}
        if self.frame is not None:
            out["frame"] = self.frame
        return out

    def annotate(self, image: np.ndarray, *, line_width: int | None = None, hide_labels: bool = False,
                 hide_conf: bool = False) -> np.ndarray:
        """A copy of the BGR ``image`` with the top five classes (and probabilities) written at its top left."""
        out = np.ascontiguousarray(image).copy()
        if hide_labels:
            return out
        h, w = out.shape[:2]
        thickness = line_width or max(round((h + w) / 2 * 0.003), 2)
        scale, font = thickness / 3, cv2.FONT_HERSHEY_SIMPLEX
        y = 0
        for i in self.top5:
            text = self.names[i] if hide_conf else f"{float(self.probs[i]):.2f} {self.names[i]}"
            (tw, th), baseline = cv2.getTextSize(text, font, scale, max(thickness - 1, 1))
            cv2.rectangle(out, (0, y), (tw + 4, y + th + baseline + 4), class_colour(i), -1)
            cv2.putText(out, text, (2, y + th + 2), font, scale, (255, 255, 255), max(thickness - 1, 1), cv2.LINE_AA)
            y += th + baseline + 4
        return out


class ClassifyPredictor:
    """A classifier ready for inference with its input size; :meth:`predict_image` per BGR image (the
    reference's evaluation transform: centre crop, ImageNet normalisation)."""

    def __init__(self, model: Detector, device: torch.device, img_size: int | None = None) -> None:
        self.model, self.device = model, device
        self.names = list(model.names)
        self.img_size = img_size or model.default_img_size
        self.dtype = model.dtype

    def predict_image(self, image: np.ndarray, path: str = "", frame: int | None = None) -> ClassifyResult:
        x = eval_transform(image, self.img_size)[None].to(self.device, self.dtype)
        with torch.inference_mode():
            probs = self.model(x).float().softmax(1)[0].cpu()
        return ClassifyResult(path, probs, self.names, tuple(image.shape[:2]), frame, image)
