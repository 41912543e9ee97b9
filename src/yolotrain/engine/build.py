"""What a run trains, by task: its data and model (a detector or segmentation model on a YOLO dataset, a
classifier on class folders), the batch AutoBatch picks and the anchors AutoAnchor fits, and its criteria.
:meth:`Trainer.setup <yolotrain.engine.trainer.Trainer.setup>` calls these; they fill the trainer's data and
model attributes, as :mod:`.loop` runs its epochs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ..classify_loss import ClassifyLoss
from ..data.classify import (
    ClassifyAugment,
    SampleIndex,
    build_classify_loaders,
    detection_layout,
    is_classify_folder,
)
from ..data.fingerprint import dataset_record
from ..data.loaders import build_loaders, run_class_names
from ..data.shapes import generate_shapes_dataset
from ..data.sources import resolve_source
from ..interop.hub import SHA256
from ..interop.resolve import resolve_trainable
from ..loss import YoloLoss
from ..model import Yolov5, parse_version
from ..model.anchors import check_anchors
from ..model.classify import Classifier, classifier_from, parse_cls_name, set_dropout
from ..segment_loss import SegmentLoss
from ..settings import ConfigError
from .autobatch import autobatch
from .config import TrainConfig
from .ema import ModelEMA
from .resume import check_resumed_data

if TYPE_CHECKING:
    from .trainer import Trainer


def build_data(trainer: Trainer) -> None:
    """The run's class names, model and loaders, and the dataset record a resume is checked against."""
    cfg = trainer.config
    if cfg.task == "classify":
        _classify_data(trainer)
        return
    root = cfg.data.path
    if root is None:
        root = str(generate_shapes_dataset())
    # The model is sized by the class names, and the batch shapes by the model's largest stride.
    dataset_names = resolve_source(root).names
    if not dataset_names:
        raise ValueError(f"{root}: the dataset defines no class names")
    trainer.names = run_class_names(dataset_names, cfg.data)
    trainer.model = _detection_model(trainer)
    if cfg.data.autobatch:
        cfg = _autobatch(trainer)
    stride = trainer.model.max_stride
    if cfg.data.img_size % stride:
        raise ValueError(f"image size must be a multiple of {stride} (the model's largest stride), "
                         f"got {cfg.data.img_size}")
    segment = trainer.model.task == "segment"
    loaders = build_loaders(dataclasses.replace(cfg.data, path=root), cfg.augment, seed=cfg.seed,
                            rank=trainer.ctx.rank, world_size=trainer.ctx.world_size, stride=stride,
                            require_names=True, masks=segment)
    if trainer.ctx.is_main and not segment:
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
    if trainer.resume_from is not None:
        check_resumed_data(trainer.resume_from, trainer.dataset_record, trainer.data_root, trainer.names, cfg.data,
                           trainer.accept_changed_data)

def _classify_data(trainer: Trainer) -> None:
    """A classifier's data: the class folders of an ImageNet-style folder, the reference's transforms."""
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
                                     augment=ClassifyAugment(fliplr=cfg.augment.fliplr, flipud=cfg.augment.flipud),
                                     workers=cfg.data.workers, cache=cfg.data.cache, seed=cfg.seed,
                                     rank=trainer.ctx.rank, world_size=trainer.ctx.world_size)
    trainer.names = loaders.names
    trainer.model = _classifier(trainer)
    trainer.train_loader, trainer.val_loader = loaders.train, loaders.val
    trainer.train_set, trainer.val_set = loaders.train.dataset, loaders.val.dataset
    trainer.train_sampler = loaders.train.batch_sampler
    trainer.data_root = loaders.root
    trainer.dataset_record = dataset_record(root, trainer.names, {"train": SampleIndex.of(loaders.train_samples),
                                                            "val": SampleIndex.of(loaders.val_samples)})
    if trainer.resume_from is not None:
        check_resumed_data(trainer.resume_from, trainer.dataset_record, trainer.data_root, trainer.names, cfg.data,
                           trainer.accept_changed_data)

def _classifier(trainer: Trainer) -> Classifier:
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

def _log_detection_of_polygons(trainer: Trainer, has_polygons: bool) -> None:
    """A detection model on YOLO-seg labels trains their boxes; copy-paste needs the polygons' masks."""
    if has_polygons:
        trainer._log("Data: polygon labels, trained as their boxes by this detection model (a segmentation "
                  "model such as --model yolov5n-seg trains the masks)")
    if trainer.config.augment.copy_paste:
        trainer._log(f"copy_paste {trainer.config.augment.copy_paste:g} is left out: it pastes objects by their "
                  "masks, which only a segmentation model trains")

def _autobatch(trainer: Trainer) -> TrainConfig:
    """The batch AutoBatch picks for this GPU takes the fraction's place in the run's settings, so
    the checkpoints hold it and a resume keeps it."""
    cfg = trainer.config
    log = trainer._log if trainer.ctx.is_main else lambda _: None
    batch = autobatch(trainer.model, cfg.data.img_size, trainer.device, cfg.data.autobatch, cfg.data.batch_size,
                      trainer.amp_dtype, log, trainer.ctx.world_size)
    trainer.config = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=batch, autobatch=0.0))
    return trainer.config

def _detection_model(trainer: Trainer) -> Yolov5:
    model = resolve_trainable(trainer.config.model, names=trainer.names)
    if isinstance(model, Classifier):
        raise ConfigError(f"{trainer.config.model} is a classifier: --data must be a folder of class folders "
                          f"(train/<class>/*.jpg, val/<class>/*.jpg), got {trainer.config.data.path or 'none'}")
    if model.num_classes != len(trainer.names):  # weights trained on other classes
        model = with_new_head(model, len(trainer.names))
    model.names = list(trainer.names)
    pretrained = trainer.config.pretrained
    if pretrained is not None and trainer.resume_from is None:
        source = resolve_trainable(pretrained)
        fresh = model.load_matching(source.state_dict())
        if trainer.ctx.is_main:
            total = len(model.state_dict())
            trainer._log(f"Transferred {total - len(fresh)}/{total} tensors from {pretrained} into "
                      f"yolov5{model.version}")
    return model


def check_anchors_of(trainer: Trainer, model: Yolov5) -> None:
    """AutoAnchor on the training labels; every process computes the same anchors from the seed."""
    cfg = trainer.config
    report = check_anchors(model, trainer.train_set.shapes, trainer.train_set.labels, cfg.data.img_size,
                           cfg.loss.anchor_t, seed=cfg.seed, log=trainer._log if trainer.ctx.is_main else None)
    if trainer.ctx.is_main:
        trainer._log(report.summary())


def with_new_head(model: Yolov5, num_classes: int) -> Yolov5:
    """Same backbone and neck for another class count; the Detect convolutions start fresh."""
    anchors = model.head.anchors * model.head.stride.view(-1, 1, 1)
    fresh = Yolov5(model.spec, num_classes=num_classes, anchors=anchors, in_channels=model.in_channels)
    head_convs = f"model.{len(model.model) - 1}.m."
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(head_convs)}
    fresh.load_state_dict(state, strict=False)  # same architecture: only the head convolutions are missing
    return fresh


def criteria(trainer: Trainer, model: Yolov5 | Classifier, ema: ModelEMA | None) -> tuple[Callable, Callable | None]:
    """The training criterion (the user's ``loss`` factory, else the task's loss with the run's settings)
    and, on the process that validates, the validation one on the EMA model."""
    cfg = trainer.config
    img_size = cfg.data.img_size
    if model.task == "classify":
        criterion = (trainer.loss_factory(model, False) if trainer.loss_factory is not None
                     else ClassifyLoss(cfg.loss.label_smoothing))
        return criterion, (ClassifyLoss(cfg.loss.label_smoothing) if ema is not None else None)
    loss = partial(SegmentLoss, overlap=cfg.data.overlap_mask) if model.task == "segment" else YoloLoss
    criterion = (trainer.loss_factory(model, cfg.data.rect) if trainer.loss_factory is not None
                 else loss(model, rect_training=cfg.data.rect, img_size=img_size, hyp=cfg.loss))
    return criterion, (loss(ema.module, rect_training=True, img_size=img_size, hyp=cfg.loss)
                       if ema is not None else None)


def from_scratch_hint(cfg: TrainConfig) -> str:
    """How to start the run's architecture from published weights instead of random ones."""
    if cfg.task == "classify":
        return "--model yolov5s.pt starts one from the official COCO weights, cut as the reference cuts it"
    name = f"yolov5{parse_version(cfg.model)}"
    if f"{name}.pt" in SHA256:
        return f"--model {name}.pt starts from the official COCO weights"
    return f"--cfg {name}.yaml --weights {name.removesuffix('-seg')}.pt starts from the detection weights"
