"""Classification's training: a classifier on an ImageNet-style folder of class folders, the reference's
``classify/train.py`` recipe, :class:`~yolotrain.loss.ClassifyLoss`, and its results.csv columns
and logger tags."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...data.check import save_class_counts
from ...data.classify import (
    ClassifyAugment,
    SampleIndex,
    build_classify_loaders,
    detection_layout,
    is_classify_folder,
)
from ...data.fingerprint import dataset_record
from ...interop.loading.anchor_free import is_anchor_free_classifier_name
from ...interop.loading.resolve import resolve_trainable
from ...loss import ClassifyLoss
from ...model.classify import Classifier, classifier_from, is_classifier_name, parse_cls_name, set_dropout
from ...settings import ConfigError

# The reference's classify/train.py recipe: Adam at 1e-3, decay 5e-5, momentum 0.9, no accumulation
# (nominal batch = batch) and no warm-up, label smoothing 0.1, 224 px, 10 epochs of batch 64. The settings
# that have a detection default take these only when not given.
CLASSIFY_DEFAULTS = {"data.img_size": 224, "epochs": 10, "data.batch_size": 64, "optim.optimizer": "Adam",
                     "optim.lr0": 0.001}
CLASSIFY_RECIPE = {"optim.momentum": 0.9, "optim.weight_decay": 5e-5, "optim.warmup_epochs": 0.0,
                   "loss.label_smoothing": 0.1}

# Validation metrics' columns of results.csv: accuracies (the validation loss follows, as in the reference's
# classify/train.py).
RESULT_METRICS = ("top1", "top5")
# results.csv column → the reference's classify/train.py TensorBoard tag.
TAGS = {"train_loss": "train/loss", "val_loss": "val/loss", "top1": "metrics/accuracy_top1",
        "top5": "metrics/accuracy_top5"}


class ClassifyTraining:
    """Classification's answers to the engine (see the "Training" methods of :class:`~yolotrain.task.Task`)."""

    def claims_model_name(self, model: str) -> bool:
        """A published ``-cls`` name (YOLOv5's, YOLOv8's, YOLO11's) or a torchvision classifier's."""
        return is_classifier_name(model) or is_anchor_free_classifier_name(model)

    def claims_dataset(self, path: str) -> bool:
        """A folder of class folders (a detector given one is cut into a classifier, as the reference's
        ``classify/train.py`` cuts ``--model yolov5s.pt``)."""
        return is_classify_folder(path)

    def training_defaults(self, data: str | None) -> Mapping[str, Any]:
        return CLASSIFY_DEFAULTS

    def training_recipe(self, model: str, data: str | None) -> Mapping[str, Any]:
        return CLASSIFY_RECIPE

    def from_scratch_hint(self, config: Any) -> str:
        return "--model yolov5s.pt starts one from the official COCO weights, cut as the reference cuts it"

    def build_training_data(self, trainer: Any, autobatch: Callable[[], Any]) -> None:
        """The class folders of an ImageNet-style folder, the reference's transforms."""
        cfg = trainer.config
        root = cfg.data.path
        if root is None or not is_classify_folder(root):
            detection = None if root is None else detection_layout(root)
            raise ConfigError(f"{cfg.model} is a classifier: --data must be a folder of class folders "
                              f"(train/<class>/*.jpg, val/<class>/*.jpg), got {root or 'none'}"
                              + (f", {detection}" if detection else ""))
        if cfg.data.autobatch:
            raise ConfigError("--autobatch sizes detection batches; give a classifier's --batch-size")
        for name in ("image_weights", "quad"):
            if getattr(cfg.data, name):
                raise ConfigError(f"--{name.replace('_', '-')} applies to detection batches, not a classifier's")
        loaders = build_classify_loaders(root, cfg.data.img_size, cfg.data.batch_size,
                                         augment=ClassifyAugment(fliplr=cfg.augment.fliplr,
                                                                 flipud=cfg.augment.flipud),
                                         workers=cfg.data.workers, cache=cfg.data.cache, seed=cfg.seed,
                                         rank=trainer.ctx.rank, world_size=trainer.ctx.world_size)
        trainer.names = loaders.names
        trainer.model = _classifier(trainer)
        trainer.train_loader, trainer.val_loader = loaders.train, loaders.val
        trainer.train_set, trainer.val_set = loaders.train.dataset, loaders.val.dataset
        trainer.train_sampler = loaders.train.batch_sampler
        trainer.data_root = loaders.root
        trainer.dataset_record = dataset_record(root, trainer.names,
                                                {"train": SampleIndex.of(loaders.train_samples),
                                                 "val": SampleIndex.of(loaders.val_samples)})

    def fit_anchors(self, trainer: Any, model: Any) -> None:
        """A classifier has no anchors to fit."""

    def training_criteria(self, model: Any, ema_model: Any | None, config: Any,
                          custom: Callable[[Any, bool], Callable] | None) -> tuple[Callable, Callable | None]:
        criterion = custom(model, False) if custom is not None else ClassifyLoss(config.loss.label_smoothing)
        return criterion, (ClassifyLoss(config.loss.label_smoothing) if ema_model is not None else None)

    def model_label(self, model: Any) -> str:
        return model.arch

    def save_training_labels(self, path: Path, labels: Any, names: Sequence[str]) -> Path:
        """The images of each class (``labels``: the class of each image)."""
        counts = np.bincount(np.asarray(labels, np.int64), minlength=len(names))
        return save_class_counts({"train": counts}, list(names), path)

    @property
    def result_columns(self) -> tuple[str, ...]:
        return RESULT_METRICS

    def result_values(self, result: Any) -> dict[str, float]:
        return {"top1": result.top1, "top5": result.top5, "val_loss": result.loss}

    def result_summary(self, result: Any) -> str:
        return f"top1 {result.top1:.3f}  top5 {result.top5:.3f}  loss {result.loss:.4f}"

    @property
    def logger_tags(self) -> Mapping[str, str]:
        return TAGS


def _classifier(trainer: Any) -> Classifier:
    """The classifier the reference's classify/train.py trains: a published -cls or torchvision name, a
    classifier's weights with their head resized, or a detector cut at ``cutoff`` with a Classify head."""
    cfg = trainer.config
    if cfg.pretrained is not None:
        raise ConfigError("--pretrained starts a detection or segmentation architecture; a classifier takes "
                          "the weights as --model (yolov5s.pt is cut into a classifier)")
    cutoff = cfg.classify.cutoff
    if parse_cls_name(cfg.model) and not Path(cfg.model).exists():
        model = Classifier.from_name(cfg.model, len(trainer.names), trainer.names, cutoff)
    else:
        model = classifier_from(resolve_trainable(cfg.model, names=trainer.names), len(trainer.names), trainer.names,
                                cutoff)
    if cfg.classify.dropout is not None:
        set_dropout(model, cfg.classify.dropout)
    return model.train()
