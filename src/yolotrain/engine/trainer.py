"""The trainer: one :class:`TrainConfig` run on one process or many (torchrun), the reference YOLOv5
recipe. It builds the data and model of its task (:mod:`.build`), the optimiser and step (``setup``),
then runs the epoch loop (:mod:`.loop`) over the step (:mod:`.step`) with the state that is saved and
resumed (:mod:`.state`); where a resumed run goes on from is decided in :mod:`.resume`."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from ..callbacks import Callback, CallbackError, Callbacks, CallbackSpec, as_callbacks
from ..data.batch import Batch
from ..data.dataset import ImageReadError
from ..devices import select_device
from ..interop.loading.resolve import check_published_name, weights_inputs
from ..loss import YoloLoss
from ..model import Yolov5
from ..model.classify import Classifier
from ..outputs import dataset_inputs, refuse_overwriting_inputs
from ..runs import RunLock, next_run_dir
from ..settings import ConfigError, flat_names, from_mapping
from ..task import Task, get_task, task_of
from ..tasks.detect.train import RESULT_METRICS
from . import distributed as D
from .build import build_data, criteria, from_scratch_hint
from .config import TrainConfig, resolve_config, with_runtime
from .ema import ModelEMA
from .loggers import RunLogging, require_loggers
from .loop import (
    LoaderProcessError,
    data_loading_failure,
    received,
    run_epochs,
    silence_loader_death_signals,
)
from .optim import AUTO, build_optimizer, choose_optimizer, lr_lambda
from .prepare import autocast_dtype, freeze_layers, grad_scaler, precision_line, seed_everything
from .results import TrainingError, TrainResult
from .resume import (
    RESUME_NAMES,
    RESUME_SETTINGS,
    ResumeOptions,
    elastic_restart,
    find_resume_checkpoint,
    resumed_config,
)
from .state import TrainState
from .step import TrainStep

__all__ = ["RESULT_METRICS", "RESUME_NAMES", "LoaderProcessError", "ResumeOptions", "TrainResult", "Trainer",
           "TrainingError", "autocast_dtype", "data_loading_failure", "find_resume_checkpoint", "received",
           "resume_training", "seed_everything", "train"]


class Trainer:
    """Runs one :class:`TrainConfig`. Only rank 0 prints, validates and writes files."""

    def __init__(self, config: TrainConfig, ctx: D.DistributedContext | None = None,
                 loss: Callable[[Yolov5, bool], Callable] | None = None, resume_from: Path | None = None,
                 setting_files: Sequence[str | os.PathLike] = (),
                 accept_changed_data: bool = ResumeOptions.accept_changed_data,
                 callbacks: Callbacks | CallbackSpec | None = None) -> None:
        """``loss(model, rect_training)`` builds a custom training criterion (default: :class:`YoloLoss`
        with the run's loss settings); it is called as ``criterion(outputs, targets, pred_size=...)``
        and must return a scalar. ``resume_from`` continues the run of that ``last`` checkpoint, whose
        configuration ``config`` must be (see :func:`resume_training`), on the data it recorded unless
        ``accept_changed_data``. ``setting_files`` (the ``--config`` and ``--hyp`` files ``config`` was
        read from) are inputs the run folder must not write over. ``callbacks`` (``{hook: fn or [fn, ...]}``)
        run after the default ones (results.csv, plots, loggers); see :mod:`yolotrain.callbacks`.
        The data, model, state and step are built by :meth:`setup`; until then they are None."""
        self.loss_factory = loss
        self.setting_files = [Path(f) for f in setting_files]
        self.config = resolve_config(config)
        self.resume_from = resume_from
        self.accept_changed_data = accept_changed_data
        self.ctx = ctx or D.context_from_env()
        self.device = select_device(self.config.device, self.ctx.local_rank)
        self.amp_dtype = autocast_dtype(self.config.amp, self.device)  # a bad choice fails before the data scan
        cfg = self.config
        if cfg.data.batch_size % self.ctx.world_size:
            raise ValueError(f"batch {cfg.data.batch_size} is not divisible by {self.ctx.world_size} processes")
        if not (Path(cfg.model).suffix or Path(cfg.model).exists() or get_task(cfg.task).claims_model_name(cfg.model)):
            check_published_name(cfg.model)  # an unknown model name fails now, not after the data scan
        require_loggers(cfg.loggers)  # a missing package too
        self.callbacks = Callbacks()
        RunLogging().register(self.callbacks)
        self.callbacks.extend(as_callbacks(callbacks))
        self.stop = False  # a callback sets it to end the run after the current epoch
        self.save_dir: Path | None = None
        # The data (built by _build_data).
        self.names: list[str] = []
        self.model: Yolov5 | Classifier | None = None  # the plain module: its weights are the ones saved
        self.train_loader: DataLoader | None = None
        self.train_set: Any = None
        self.train_sampler: Any = None
        self.val_loader: DataLoader | None = None  # validation runs on rank 0 alone, over the whole split
        self.val_set: Any = None
        self.data_root: Path | None = None
        self.dataset_record: dict[str, Any] | None = None
        # The training (built by setup).
        self.ddp: nn.Module | None = None  # the model, DDP-wrapped with several processes
        self.forward: Callable[[torch.Tensor], Any] | None = None  # ddp, compiled on request
        self.lf: Callable[[int], float] | None = None  # the learning-rate factor of an epoch
        self.criterion: Callable | None = None
        self.val_criterion: YoloLoss | None = None
        self.state: TrainState | None = None
        self.step: TrainStep | None = None
        # The epoch loop's (loop.py).
        self.epoch_lrs: list[float] = []  # the rates the epoch ended with, for results.csv
        self.best_epoch = 0  # the last epoch whose fitness improved, for --patience

    def add_callback(self, hook: str, fn: Callback) -> None:
        """Run ``fn`` at ``hook`` (a name of :data:`yolotrain.callbacks.HOOKS`), after those added before."""
        self.callbacks.add(hook, fn)

    def _fire(self, hook: str, *args: Any) -> None:
        if self.ctx.is_main:
            self.callbacks.run(hook, *args)

    # The training state as attributes of the trainer, as callbacks and scripts know them.
    @property
    def ema(self) -> ModelEMA | None:
        return self.state.ema

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.state.optimizer

    @property
    def scaler(self) -> torch.amp.GradScaler:
        return self.state.scaler

    @property
    def accumulate(self) -> int:
        return self.state.accumulate

    @accumulate.setter
    def accumulate(self, batches: int) -> None:
        self.state.accumulate = batches

    @property
    def best_fitness(self) -> float:
        return self.state.best_fitness

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.state.history

    def setup(self) -> None:
        """Data, model, optimiser, EMA and loss, ready for :meth:`train_batch`; :meth:`fit` calls it."""
        cfg, ctx = self.config, self.ctx
        if ctx.is_main:
            self._log(precision_line(cfg.amp, self.amp_dtype, self.device))
        D.init_process_group(ctx, self.device)
        # Per-rank seeds: augmentations differ by sample index already, global RNGs differ by rank.
        seed_everything(cfg.seed + ctx.rank)
        if ctx.is_main and cfg.pretrained is None and not (Path(cfg.model).suffix or Path(cfg.model).exists()):
            self._log(f"Model {cfg.model}: random initial weights (training from scratch); "
                      f"{from_scratch_hint(cfg)}")
        build_data(self)
        if self.config.optim.optimizer == AUTO:  # chosen once: resumed runs read the choice from their settings
            optim, line = choose_optimizer(self.config.optim, len(self.train_set), self.config.data.batch_size,
                                           self.config.epochs, len(self.names))
            self.config = dataclasses.replace(self.config, optim=optim)
            if ctx.is_main:
                self._log(line)
        cfg = self.config  # AutoBatch may have chosen the batch, auto the optimiser
        model = self.model.to(self.device)
        if cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if cfg.autoanchor and self.resume_from is None:
            task_of(model).fit_anchors(self, model)
        freeze_layers(model, self.config.freeze, self._log if ctx.is_main else None)
        if cfg.sync_bn and ctx.enabled:
            if self.device.type != "cuda":
                raise ValueError("--sync-bn needs CUDA devices (PyTorch has no SyncBatchNorm on the CPU)")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.model = model
        self.ddp = (nn.parallel.DistributedDataParallel(model, device_ids=[self.device] if self.device.type == "cuda"
                                                         else None) if ctx.enabled else model)
        # The module that runs the training forward: compiled on request; weights, EMA and checkpoints
        # keep using the plain modules, so state-dict names do not change.
        self.forward = torch.compile(self.ddp) if cfg.compile else self.ddp
        optim, batch = cfg.optim, cfg.data.batch_size
        accumulate = max(round(optim.nominal_batch / batch), 1)
        weight_decay = optim.weight_decay * batch * accumulate / optim.nominal_batch
        optimizer = build_optimizer(model, optim.optimizer, optim.lr0, optim.momentum, weight_decay)
        self.lf = lr_lambda(cfg.epochs, optim.lrf, optim.cos_lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=self.lf)
        ema = ModelEMA(model, cfg.ema.decay, cfg.ema.tau) if ctx.is_main else None
        scaler = grad_scaler(self.device, self.amp_dtype)
        self.state = TrainState(model, ema, optimizer, scheduler, scaler, accumulate)
        self.criterion, self.val_criterion = criteria(self, model, ema)
        self.save_dir = (self.resume_from.parent.parent if self.resume_from is not None
                         else next_run_dir(cfg.project, cfg.name, cfg.exist_ok))
        self.step = TrainStep(cfg, ctx, self.device, self.amp_dtype, self.state, self.forward, self.criterion,
                              lambda hook, *args: self._fire(hook, self, *args), self.save_dir)
        self._refuse_overwriting_inputs()

    def _refuse_overwriting_inputs(self) -> None:
        """The run folder must not be, hold or lie inside the weights, model YAML, data or settings files it
        reads (a resumed run writes over its own checkpoint, which is therefore not counted)."""
        cfg = self.config
        model_file = [("--model", Path(cfg.model))] if Path(cfg.model).is_file() else []
        weights = weights_inputs(cfg.model) if model_file and Path(cfg.model).suffix not in (".yaml", ".yml") \
            else model_file
        if cfg.pretrained is not None and Path(cfg.pretrained).exists():
            weights += weights_inputs(cfg.pretrained)
        data = dataset_inputs([*self.train_set.im_files, *self.val_set.im_files], cfg.data.path)
        settings = [("settings file", path) for path in self.setting_files]
        refuse_overwriting_inputs([("--project/--name", self.save_dir)], weights + data + settings)

    # ----------------------------------------------------------------------------------- loop
    def fit(self) -> TrainResult:
        """Train for the configured epochs; returns where the weights and results were written."""
        ended_by: BaseException | None = None  # what teardown is told
        try:
            self._fire("on_pretrain_routine_start", self)
            self.setup()
            # One writer per run folder: a second run or resume of it stops here, naming the holder.
            with RunLock(self.save_dir) if self.ctx.is_main else contextlib.nullcontext():
                if self.resume_from is not None:
                    self.state.load(self.resume_from)
                    if self.ctx.is_main:
                        self._log(f"Resuming {self.save_dir} from epoch {self.state.start_epoch + 1}/"
                                  f"{self.config.epochs}")
                self._fire("on_params_update", self, self.config.to_dict())
                self._fire("on_pretrain_routine_end", self)
                try:
                    return run_epochs(self)
                except (RuntimeError, ImageReadError) as error:
                    reason = data_loading_failure(error)
                    if reason is None:
                        raise
                    silence_loader_death_signals()
                    raise TrainingError(self._stopped_message(reason)) from None
        except CallbackError as failure:
            ended_by = CallbackError(f"{failure}; {self._checkpoint_kept()}")
            raise ended_by from None
        except BaseException as failure:
            ended_by = failure
            raise
        finally:
            try:
                self._fire("teardown", self, ended_by)
            finally:
                D.destroy_process_group()

    def _stopped_message(self, reason: str) -> str:
        """One line: why training stopped, and which checkpoint it can continue from."""
        return f"training stopped: {reason}; {self._checkpoint_kept()}"

    def _checkpoint_kept(self) -> str:
        last = self.save_dir / "weights" / "last" if self.save_dir is not None else None
        if last is None or not last.with_suffix(".json").exists():
            return "no checkpoint was saved yet"
        return f"the last checkpoint {last}.safetensors is intact: continue with --resume {self.save_dir}"

    @property
    def task(self) -> Task:
        """The task of the model being trained (built by :meth:`setup`)."""
        return task_of(self.model)

    def train_batch(self, batch: Batch, epoch: int, index: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One training iteration on a loader ``batch`` (the ``index``-th of the epoch): forward, loss, backward,
        and the optimiser and EMA update when ``accumulate`` steps have gathered since the last one (see
        :class:`TrainStep`); the task takes the criterion's targets from the batch (a segmentation batch's masks
        with its rows). Returns the images as the model saw them (device, layout, multi-scale size) and the
        detached loss."""
        return self.step(batch.imgs, self.task.training_targets(batch, self.device), epoch, index, step)

    def _log(self, message: str) -> None:
        tqdm.write(message)


def resume_training(path: str | os.PathLike, *, device: str | None = None, workers: int | None = None,
           loss: Callable[[Yolov5, bool], Callable] | None = None,
           accept_changed_data: bool = ResumeOptions.accept_changed_data) -> Trainer:
    """A trainer that continues the run of a ``last`` checkpoint with the configuration saved in it, on
    the dataset at the location it recorded (whatever the working folder is now); only where it runs
    (``device``, ``workers``) may change, and the data only with ``accept_changed_data``."""
    path = Path(path)
    saved = resumed_config(path)
    return Trainer(with_runtime(saved, device, workers), loss=loss, resume_from=path,
                   accept_changed_data=accept_changed_data)


def train(config: TrainConfig | Mapping[str, Any] | str | os.PathLike | None = None,
          loss: Callable[[Yolov5, bool], Callable] | None = None, *,
          hyp: str | os.PathLike | Mapping[str, Any] | None = None, resume: str | os.PathLike | bool = False,
          callbacks: Callbacks | CallbackSpec | None = None, **settings: Any) -> TrainResult:
    """Train a detector: ``yolotrain.train(data="data.yaml", model="yolov5s", epochs=50, lr0=0.02)``.

    ``config``, ``hyp`` and the keyword ``settings`` are resolved by
    :func:`yolotrain.engine.config.resolve_config` (flat names such as ``img_size``, ``mosaic``, ``lr0``,
    or whole sections). ``resume`` (``True`` for the newest run under ``project``, or a run folder or
    ``last`` checkpoint) continues a run with its saved configuration; only ``device`` and ``workers``
    may be given with it, and the :class:`ResumeOptions` (``accept_changed_data=True``). ``loss``
    optionally builds a custom criterion from ``(model, rect_training)``. ``callbacks``
    (``{"on_fit_epoch_end": fn}``, a list of functions per hook allowed) run at the hooks of
    :data:`yolotrain.callbacks.HOOKS`.
    """
    user_callbacks = as_callbacks(callbacks)  # an unknown hook fails before anything is read
    options = from_mapping(ResumeOptions, {k: settings.pop(k) for k in flat_names(ResumeOptions) if k in settings})
    if resume:
        extra = sorted(set(settings) - RESUME_SETTINGS) + (["config"] if config is not None else []) + \
            (["hyp"] if hyp is not None else [])
        if extra:
            raise ConfigError(f"resume continues a run with its own saved settings; only device and workers may "
                              f"change (got {', '.join(extra)})")
        path = find_resume_checkpoint(resume, settings.get("project", TrainConfig.project))
        job = (_elastic_restart(path.parent.parent.parent, settings.get("device"), settings.get("workers"), loss)
               or resume_training(path, device=settings.get("device"), workers=settings.get("workers"), loss=loss,
                                  accept_changed_data=options.accept_changed_data))
        return _fit_with(job, user_callbacks)
    if options != ResumeOptions():
        raise ConfigError("accept_changed_data applies only with resume")
    setting_files = [f for f in (config, hyp) if isinstance(f, (str, os.PathLike))]
    resolved = resolve_config(config, hyp=hyp, **settings)
    job = _elastic_restart(resolved.project, resolved.device, resolved.data.workers, loss, resolved) or \
        Trainer(resolved, loss=loss, setting_files=setting_files)
    return _fit_with(job, user_callbacks)


def _fit_with(job: Trainer | TrainResult, callbacks: Callbacks) -> TrainResult:
    """``job``'s result: a finished run's as it is, else the trainer's, run with ``callbacks`` added."""
    if isinstance(job, TrainResult):
        return job
    job.callbacks.extend(callbacks)
    return job.fit()


def _elastic_restart(project: str | os.PathLike, device: str | None, workers: int | None,
                     loss: Callable[[Yolov5, bool], Callable] | None,
                     config: TrainConfig | None = None) -> Trainer | TrainResult | None:
    """When torchrun's elastic agent has restarted the group, a trainer that continues the job's run
    from its last checkpoint (no ``--resume`` needed), or, before any epoch was saved, starts ``config``
    again in the same run folder; the run's result when it had finished all epochs before the restart
    (a process died on its way out); ``None`` on a first launch."""
    restart = elastic_restart(project)
    if restart is None or restart.finished is not None:
        return restart.finished if restart is not None else None
    if restart.last is not None:
        return resume_training(restart.last, device=device, workers=workers, loss=loss)
    if config is None:
        return None
    run_dir = restart.run_dir
    return Trainer(dataclasses.replace(config, project=str(run_dir.parent), name=run_dir.name, exist_ok=True),
                   loss=loss)
