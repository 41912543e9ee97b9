"""Detection's training: a detector on a YOLO dataset (or the built-in shapes), its results.csv columns and
logger tags; what its model's head design decides (the recipe, AutoAnchor, the loss, a new head for other
classes) is the model's family's (:mod:`yolotrain.family`). The engine asks these through
:class:`~yolotrain.task.Task`; segmentation inherits them and overrides what masks change."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import torch

from ...data.batch import Batch
from ...data.check import save_label_stats
from ...data.fingerprint import dataset_record
from ...data.loaders import build_loaders, run_class_names
from ...data.shapes import generate_shapes_dataset
from ...data.sources import resolve_source
from ...draw import draw_batch
from ...family import family_of, family_of_name
from ...interop.loading.resolve import resolve_trainable
from ...model.classify import Classifier
from ...settings import ConfigError
from ...task import task_of

# The built-in shapes dataset: small images and an optimiser step every batch, so a CPU trains yolov5n
# past mAP50 0.5 in a couple of minutes (measured: 0.61 at epoch 15, 0.84 at epoch 22).
SHAPES_DEFAULTS = {"data.img_size": 160, "epochs": 30, "data.batch_size": 16, "optim.optimizer": "AdamW",
                   "optim.lr0": 0.002, "optim.nominal_batch": 16}
# The reference's defaults for real datasets (lr0 follows the optimiser: DEFAULT_LR0).
DATASET_DEFAULTS = {"data.img_size": 640, "epochs": 100, "data.batch_size": 16, "optim.optimizer": "SGD",
                    "optim.nominal_batch": 64}

# Validation metrics' columns of results.csv (left empty in epochs that skip validation); the loss parts follow.
RESULT_METRICS = ("precision", "recall", "mAP50", "mAP50-95")
# results.csv column → the reference's TensorBoard tag.
TAGS = {
    "train_box": "train/box_loss", "train_obj": "train/obj_loss", "train_cls": "train/cls_loss",
    "precision": "metrics/precision", "recall": "metrics/recall", "mAP50": "metrics/mAP_0.5",
    "mAP50-95": "metrics/mAP_0.5:0.95", "val_box": "val/box_loss", "val_obj": "val/obj_loss",
    "val_cls": "val/cls_loss",
    # the anchor-free family's distribution focal loss, under ultralytics' tags
    "train_dfl": "train/dfl_loss", "val_dfl": "val/dfl_loss",
}


class DetectTraining:
    """Detection's answers to the engine (see the "Training" methods of :class:`~yolotrain.task.Task`)."""

    # What the task's loaders read the labels as (yolotrain.data.loaders.DATASET_KINDS): its batches' fields.
    dataset_kind = "boxes"

    def training_defaults(self, data: str | None) -> Mapping[str, Any]:
        return SHAPES_DEFAULTS if data is None else DATASET_DEFAULTS

    def training_recipe(self, model: str, data: str | None) -> Mapping[str, Any]:
        """The recipe of the family whose model ``model`` names (YOLOv5's: the shared defaults)."""
        return family_of_name(model).training_recipe(data)

    def from_scratch_hint(self, config: Any) -> str:
        return family_of_name(config.model).from_scratch_hint(config.model)

    def build_training_data(self, trainer: Any, autobatch: Callable[[], Any]) -> None:
        """A detection or segmentation model on a YOLO dataset (the shapes when none is given); the model
        built (its task follows the weights or YAML) decides whether the loaders yield masks."""
        cfg = trainer.config
        root = cfg.data.path
        if root is None:
            root = str(generate_shapes_dataset())
        # The model is sized by the class names, and the batch shapes by the model's largest stride.
        dataset_names = resolve_source(root).names
        if not dataset_names:
            raise ValueError(f"{root}: the dataset defines no class names")
        trainer.names = run_class_names(dataset_names, cfg.data)
        trainer.model = self.training_model(trainer, root)
        if cfg.data.autobatch:
            cfg = autobatch()
        stride = trainer.model.max_stride
        if cfg.data.img_size % stride:
            raise ValueError(f"image size must be a multiple of {stride} (the model's largest stride), "
                             f"got {cfg.data.img_size}")
        kind = task_of(trainer.model).dataset_kind
        loaders = build_loaders(dataclasses.replace(cfg.data, path=root), cfg.augment, seed=cfg.seed,
                                rank=trainer.ctx.rank, world_size=trainer.ctx.world_size, stride=stride,
                                require_names=True, kind=kind)
        if trainer.ctx.is_main and kind == "boxes":
            _log_detection_of_polygons(trainer, loaders.train_index.has_polygons)
        trainer.train_loader = loaders.train
        trainer.train_set = trainer.train_loader.dataset
        trainer.train_sampler = trainer.train_loader.batch_sampler
        # Validation runs on rank 0 alone, over the whole split.
        trainer.val_loader = loaders.val
        trainer.val_set = trainer.val_loader.dataset
        trainer.data_root = loaders.root
        trainer.dataset_record = dataset_record(root, dataset_names, {"train": loaders.train_index,
                                                                   "val": loaders.val_index},
                                             generated=cfg.data.path is None)

    def training_model(self, trainer: Any, root: str) -> Any:
        """The model ``trainer`` trains on the dataset at ``root`` (its class names set): the run's model, with a
        new head for the data's class count, and the ``--pretrained`` weights that fit it."""
        return _detection_model(trainer)

    def fit_anchors(self, trainer: Any, model: Any) -> None:
        family_of(model).fit_anchors(trainer, model)

    def training_loss(self, model: Any, config: Any) -> Callable[..., Callable]:
        """The loss class (or factory) of ``model``'s family for this task, called as
        ``loss(model, rect_training=, img_size=, hyp=)``."""
        return family_of(model).training_loss(self.name, config)

    def training_criteria(self, model: Any, ema_model: Any | None, config: Any,
                          custom: Callable[[Any, bool], Callable] | None) -> tuple[Callable, Callable | None]:
        loss = self.training_loss(model, config)
        img_size = config.data.img_size
        criterion = (custom(model, config.data.rect) if custom is not None
                     else loss(model, rect_training=config.data.rect, img_size=img_size, hyp=config.loss))
        return criterion, (loss(ema_model, rect_training=True, img_size=img_size, hyp=config.loss)
                           if ema_model is not None else None)

    def model_label(self, model: Any) -> str:
        return model.arch_name

    def save_training_labels(self, path: Path, labels: Any, names: Sequence[str]) -> Path:
        """Instances per class, box centres and box sizes (``labels``: one ``[n, 5]`` array of class, cx, cy,
        w, h per image), drawn as ``yolotrain data check`` draws them."""
        return save_label_stats(list(labels), list(names), path)

    def save_training_batch(self, path: Path, batch: Batch, names: Sequence[str], config: Any) -> bool:
        """The batch with its labels' boxes and names (see :func:`yolotrain.draw.draw_batch`)."""
        cv2.imwrite(str(path), draw_batch(batch.imgs, batch.targets, names, self.batch_masks(batch),
                                          config.data.overlap_mask))
        return True

    def batch_masks(self, batch: Batch) -> torch.Tensor | None:
        """A loader batch's target masks; a detection batch has none."""
        return None

    @property
    def result_columns(self) -> tuple[str, ...]:
        return RESULT_METRICS

    def result_values(self, result: Any) -> dict[str, float]:
        """Boxes' precision, recall and mAPs, the masks' too when the result has them, and the loss parts."""
        metrics = {"precision": result.mp, "recall": result.mr, "mAP50": result.map50, "mAP50-95": result.map}
        if result.masks is not None:
            masks = result.masks
            metrics.update({"mask_precision": masks.mp, "mask_recall": masks.mr, "mask_mAP50": masks.map50,
                            "mask_mAP50-95": masks.map})
        metrics.update({f"val_{k}": v for k, v in (result.loss or {}).items()})
        return metrics

    def result_summary(self, result: Any) -> str:
        mask = (f"  mask mAP50 {result.masks.map50:.3f}  mAP50-95 {result.masks.map:.3f}"
                if result.masks is not None else "")
        return f"P {result.mp:.3f}  R {result.mr:.3f}  mAP50 {result.map50:.3f}  mAP50-95 {result.map:.3f}{mask}"

    @property
    def logger_tags(self) -> Mapping[str, str]:
        return TAGS


def _detection_model(trainer: Any) -> Any:
    model = resolve_trainable(trainer.config.model, names=trainer.names)
    if isinstance(model, Classifier):
        raise ConfigError(f"{trainer.config.model} is a classifier: --data must be a folder of class folders "
                          f"(train/<class>/*.jpg, val/<class>/*.jpg), got {trainer.config.data.path or 'none'}")
    if model.num_classes != len(trainer.names):  # weights trained on other classes
        model = family_of(model).with_new_head(model, len(trainer.names))
    model.names = list(trainer.names)
    pretrained = trainer.config.pretrained
    if pretrained is not None and trainer.resume_from is None:
        source = resolve_trainable(pretrained)
        fresh = model.load_matching(source.state_dict())
        if trainer.ctx.is_main:
            total = len(model.state_dict())
            trainer._log(f"Transferred {total - len(fresh)}/{total} tensors from {pretrained} into {model.arch_name}")
    return model


def _log_detection_of_polygons(trainer: Any, has_polygons: bool) -> None:
    """A detection model on YOLO-seg labels trains their boxes; copy-paste needs the polygons' masks."""
    if has_polygons:
        trainer._log("Data: polygon labels, trained as their boxes by this detection model (a segmentation "
                     "model such as --model yolov5n-seg trains the masks)")
    if trainer.config.augment.copy_paste:
        trainer._log(f"copy_paste {trainer.config.augment.copy_paste:g} is left out: it pastes objects by their "
                     "masks, which only a segmentation model trains")
