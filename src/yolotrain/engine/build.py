"""What a run trains: its task builds the data and model (a detector or segmentation model on a YOLO dataset,
a classifier on class folders) and its criteria; the batch AutoBatch picks is offered to it here.
:meth:`Trainer.setup <yolotrain.engine.trainer.Trainer.setup>` calls these; they fill the trainer's data and
model attributes, as :mod:`.loop` runs its epochs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..model import Yolov5
from ..model.classify import Classifier
from ..task import get_task, task_of
from .autobatch import autobatch
from .config import TrainConfig
from .ema import ModelEMA
from .resume import check_resumed_data

if TYPE_CHECKING:
    from .trainer import Trainer


def build_data(trainer: Trainer) -> None:
    """The run's class names, model and loaders, and the dataset record a resume is checked against."""
    get_task(trainer.config.task).build_training_data(trainer, lambda: _autobatch(trainer))
    if trainer.resume_from is not None:
        check_resumed_data(trainer.resume_from, trainer.dataset_record, trainer.data_root, trainer.names,
                           trainer.config.data, trainer.accept_changed_data)


def _autobatch(trainer: Trainer) -> TrainConfig:
    """The batch AutoBatch picks for this GPU takes the fraction's place in the run's settings, so
    the checkpoints hold it and a resume keeps it."""
    cfg = trainer.config
    log = trainer._log if trainer.ctx.is_main else lambda _: None
    batch = autobatch(trainer.model, cfg.data.img_size, trainer.device, cfg.data.autobatch, cfg.data.batch_size,
                      trainer.amp_dtype, log, trainer.ctx.world_size)
    trainer.config = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=batch, autobatch=0.0))
    return trainer.config


def criteria(trainer: Trainer, model: Yolov5 | Classifier, ema: ModelEMA | None) -> tuple[Callable, Callable | None]:
    """The training criterion (the user's ``loss`` factory, else the task's loss with the run's settings)
    and, on the process that validates, the validation one on the EMA model."""
    return task_of(model).training_criteria(model, ema.module if ema is not None else None, trainer.config,
                                            trainer.loss_factory)


def from_scratch_hint(cfg: TrainConfig) -> str:
    """How to start the run's architecture from published weights instead of random ones."""
    return get_task(cfg.task).from_scratch_hint(cfg)
