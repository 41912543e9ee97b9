"""The training loop: the reference YOLOv5 recipe on one process or many (torchrun)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from ..atomic import write_atomic
from ..callbacks import Callback, CallbackError, Callbacks, CallbackSpec, as_callbacks
from ..data.dataset import ImageReadError
from ..data.fingerprint import ResumeDataWarning, dataset_changes, dataset_record, record_problem
from ..data.loaders import build_loaders, run_class_names
from ..data.sources import resolve_source
from ..devices import select_device
from ..interop.resolve import resolve_trainable
from ..loss import DivergenceError, YoloLoss
from ..model import Yolov5, parse_version
from ..outputs import dataset_inputs, refuse_overwriting_inputs, weights_inputs
from ..runs import RunLock, next_run_dir
from ..settings import ConfigError, flat_names, from_mapping, setting
from . import distributed as D
from .config import TrainConfig, resolve_config, with_runtime
from .ema import ModelEMA
from .loggers import RunLogging, require_loggers
from .optim import apply_warmup, build_optimizer, lr_lambda, warmup_iterations

# Validation columns of results.csv (left empty in epochs that skip validation).
RESULT_METRICS = ("precision", "recall", "mAP50", "mAP50-95", "val_box", "val_obj", "val_cls")


class TrainingError(RuntimeError):
    """Training cannot go on (diverged, bad configuration); the message says why and what to do."""


@dataclass(frozen=True)
class ResumeOptions:
    """What ``resume`` may be told besides where the run goes on (device, workers)."""

    accept_changed_data: bool = setting(False, "with --resume: go on although the dataset changed since the "
                                        "checkpoint (class names, image count or labels)")


@dataclass
class TrainResult:
    save_dir: Path
    last: Path
    best: Path
    epochs_run: int
    metrics: dict[str, float] = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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
        run after the default ones (results.csv, plots, loggers); see :mod:`yolotrain.callbacks`."""
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
        if not (Path(cfg.model).suffix or Path(cfg.model).exists()):
            parse_version(cfg.model)  # an unknown model name fails now, not after the data scan
        require_loggers(cfg.loggers)  # a missing package too
        self.callbacks = Callbacks()
        RunLogging().register(self.callbacks)
        self.callbacks.extend(as_callbacks(callbacks))
        self.stop = False  # a callback sets it to end the run after the current epoch
        self.save_dir: Path | None = None

    def add_callback(self, hook: str, fn: Callback) -> None:
        """Run ``fn`` at ``hook`` (a name of :data:`yolotrain.callbacks.HOOKS`), after those added before."""
        self.callbacks.add(hook, fn)

    def _fire(self, hook: str, *args: Any) -> None:
        if self.ctx.is_main:
            self.callbacks.run(hook, *args)

    # ----------------------------------------------------------------------------------- data
    def _build_data(self) -> None:
        cfg = self.config
        root = cfg.data.path
        if root is None:
            from ..data.shapes import generate_shapes_dataset

            root = str(generate_shapes_dataset())
        # The model is sized by the class names, and the batch shapes by the model's largest stride.
        dataset_names = resolve_source(root).names
        if not dataset_names:
            raise ValueError(f"{root}: the dataset defines no class names")
        self.names = run_class_names(dataset_names, cfg.data)
        self.model = self._build_model()
        if cfg.data.autobatch:
            cfg = self._autobatch()
        stride = self.model.max_stride
        if cfg.data.img_size % stride:
            raise ValueError(f"image size must be a multiple of {stride} (the model's largest stride), "
                             f"got {cfg.data.img_size}")
        loaders = build_loaders(dataclasses.replace(cfg.data, path=root), cfg.augment, seed=cfg.seed,
                                rank=self.ctx.rank, world_size=self.ctx.world_size, stride=stride,
                                require_names=True)
        self.train_loader = loaders.train
        self.train_set = self.train_loader.dataset
        self.train_sampler = self.train_loader.batch_sampler
        # Validation runs on rank 0 alone, over the whole split.
        self.val_loader = loaders.val
        self.val_set = self.val_loader.dataset
        self.data_root = loaders.root
        self.dataset_record = dataset_record(root, dataset_names, {"train": loaders.train_index,
                                                                   "val": loaders.val_index},
                                             generated=cfg.data.path is None)
        if self.resume_from is not None:
            self._check_resumed_data()

    def _check_resumed_data(self) -> None:
        """A resumed run goes on with the data its checkpoint recorded: a change stops it in one line,
        unless accepted (``accept_changed_data``); a change in the number of classes always does."""
        from ..checkpoint import CheckpointError, read_metadata

        recorded = read_metadata(self.resume_from)[0].get("dataset")
        if recorded is None:
            warnings.warn(f"{self.resume_from}: saved without a record of its dataset (by an older yolotrain); "
                          f"resuming on {self.data_root} without checking it is the same", ResumeDataWarning,
                          stacklevel=2)
            return
        problem = record_problem(recorded)
        if problem:
            raise CheckpointError(f"{self.resume_from}: field 'dataset' {problem}")
        changes = dataset_changes(recorded, self.dataset_record)
        if not changes:
            return
        what = (f"the dataset {self.data_root} changed since {self.resume_from} was saved "
                f"({'; '.join(changes)})")
        if len(run_class_names(recorded["names"], self.config.data)) != len(self.names):
            raise TrainingError(f"{what}: a resumed run cannot change its number of classes; start a new run")
        if not self.accept_changed_data:
            raise TrainingError(f"{what}; continue on it anyway with --accept-changed-data, or start a new run")
        warnings.warn(f"{what}; continuing on it (--accept-changed-data)", ResumeDataWarning, stacklevel=2)

    def _autobatch(self) -> TrainConfig:
        """The batch AutoBatch picks for this GPU takes the fraction's place in the run's settings, so
        the checkpoints hold it and a resume keeps it."""
        from .autobatch import autobatch

        cfg = self.config
        batch = autobatch(self.model, cfg.data.img_size, self.device, cfg.data.autobatch, cfg.data.batch_size,
                          self.amp_dtype, self._log if self.ctx.is_main else lambda _: None, self.ctx.world_size)
        self.config = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=batch, autobatch=0.0))
        return self.config

    # ---------------------------------------------------------------------------------- model
    def _build_model(self) -> Yolov5:
        model = resolve_trainable(self.config.model, names=self.names)
        if model.num_classes != len(self.names):  # weights trained on other classes
            model = _with_new_head(model, len(self.names))
        model.names = list(self.names)
        return model

    def setup(self) -> None:
        """Data, model, optimiser, EMA and loss, ready for :meth:`train_batch`; :meth:`fit` calls it."""
        cfg, ctx = self.config, self.ctx
        D.init_process_group(ctx, self.device)
        # Per-rank seeds: augmentations differ by sample index already, global RNGs differ by rank.
        seed_everything(cfg.seed + ctx.rank)
        if ctx.is_main and not (Path(cfg.model).suffix or Path(cfg.model).exists()):
            self._log(f"Model {cfg.model}: random initial weights (training from scratch); "
                      f"--model {cfg.model}.pt starts from the official COCO weights")
        self._build_data()
        cfg = self.config  # AutoBatch may have chosen the batch
        model = self.model.to(self.device)
        if cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if cfg.autoanchor and self.resume_from is None:
            self._check_anchors(model)
        self._freeze(model)
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
        self.first_step_done = False
        optim, batch = cfg.optim, cfg.data.batch_size
        self.accumulate = max(round(optim.nominal_batch / batch), 1)
        weight_decay = optim.weight_decay * batch * self.accumulate / optim.nominal_batch
        self.optimizer = build_optimizer(model, optim.optimizer, optim.lr0, optim.momentum, weight_decay)
        self.lf = lr_lambda(cfg.epochs, optim.lrf, optim.cos_lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda=self.lf)
        self.ema = ModelEMA(model, cfg.ema.decay, cfg.ema.tau) if ctx.is_main else None
        self._setup_precision()
        img_size = cfg.data.img_size
        self.criterion = (self.loss_factory(model, cfg.data.rect) if self.loss_factory is not None
                          else YoloLoss(model, rect_training=cfg.data.rect, img_size=img_size, hyp=cfg.loss))
        self.val_criterion = (YoloLoss(self.ema.module, rect_training=True, img_size=img_size, hyp=cfg.loss)
                              if self.ema is not None else None)
        self.start_epoch = 0
        self.best_fitness = -1.0
        self.history: list[dict[str, Any]] = []
        self.last_opt_step = -1
        self.save_dir = (self.resume_from.parent.parent if self.resume_from is not None
                         else next_run_dir(cfg.project, cfg.name, cfg.exist_ok))
        self._refuse_overwriting_inputs()

    def _refuse_overwriting_inputs(self) -> None:
        """The run folder must not be, hold or lie inside the weights, model YAML, data or settings files it
        reads (a resumed run writes over its own checkpoint, which is therefore not counted)."""
        cfg = self.config
        model_file = [("--model", Path(cfg.model))] if Path(cfg.model).is_file() else []
        weights = weights_inputs(cfg.model) if model_file and Path(cfg.model).suffix not in (".yaml", ".yml") \
            else model_file
        data = dataset_inputs([*self.train_set.im_files, *self.val_set.im_files], cfg.data.path)
        settings = [("settings file", path) for path in self.setting_files]
        refuse_overwriting_inputs([("--project/--name", self.save_dir)], weights + data + settings)

    def _setup_precision(self) -> None:
        """cuDNN autotuning, the mixed-precision notice and the gradient scaler."""
        if self.device.type == "cuda":
            # Training batches keep a few shapes (square, or the rect/multi-scale sizes), so timing the
            # cuDNN algorithms once per shape pays back within the first epoch (the reference does too).
            torch.backends.cudnn.benchmark = True
        if self.amp_dtype is not None and self.ctx.is_main:
            slow = (self.device.type == "cpu" and self.amp_dtype == torch.bfloat16
                    and not torch.ops.mkldnn._is_mkldnn_bf16_supported())
            self._log(f"Mixed precision: {str(self.amp_dtype).removeprefix('torch.')} autocast on {self.device.type}"
                      + ("; this CPU has no native bfloat16, so expect it to be slower than float32" if slow else ""))
        # Only float16 needs loss scaling: bfloat16 has float32's exponent range, so gradients do not underflow.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)

    def _check_anchors(self, model: Yolov5) -> None:
        """AutoAnchor on the training labels; every process computes the same anchors from the seed."""
        from ..model.anchors import check_anchors

        cfg = self.config
        report = check_anchors(model, self.train_set.shapes, self.train_set.labels, cfg.data.img_size,
                               cfg.loss.anchor_t, seed=cfg.seed, log=self._log if self.ctx.is_main else None)
        if self.ctx.is_main:
            self._log(report.summary())

    def _freeze(self, model: Yolov5) -> None:
        """The reference's ``--freeze``: one N freezes layers 0..N-1, several numbers those layers. Frozen
        parameters get no gradient, so the optimiser leaves them exactly as they are."""
        layers = self.config.freeze
        indices = layers if len(layers) > 1 else range(layers[0])
        prefixes = tuple(f"model.{i}." for i in indices)
        if not prefixes:
            return
        count, given = len(model.model), " ".join(map(str, layers))
        if max(layers) > count or (len(layers) > 1 and max(layers) == count):
            raise ValueError(f"--freeze {given}: the model has {count} layers (0..{count - 1})")
        frozen = [p for name, p in model.named_parameters() if name.startswith(prefixes)]
        if len(frozen) == len(list(model.parameters())):
            raise ValueError(f"--freeze {given} freezes every layer of the model: nothing to train")
        for param in frozen:
            param.requires_grad_(False)
        if self.ctx.is_main:
            self._log(f"Freezing layers {', '.join(str(i) for i in indices)}: {len(frozen)} parameter tensors "
                      f"({sum(p.numel() for p in frozen):,} values)")

    def _multi_scale(self, imgs: torch.Tensor, epoch: int, batch: int) -> torch.Tensor:
        """The reference's ``--multi-scale``: the batch resized so its long side is a random multiple of the
        largest stride in 0.5-1.5x the image size; drawn from (seed, epoch, batch), the same on every process."""
        stride = int(self.model.head.stride.max())
        size = self.config.data.img_size
        rng = np.random.default_rng([self.config.seed, epoch, batch])
        target = max(int(rng.integers(int(size * 0.5), int(size * 1.5) + stride)) // stride * stride, stride)
        factor = target / max(imgs.shape[2:])
        if factor == 1:
            return imgs
        shape = [math.ceil(side * factor / stride) * stride for side in imgs.shape[2:]]
        return F.interpolate(imgs, size=shape, mode="bilinear", align_corners=False)

    def _no_longer_improving(self, epoch: int, validated: bool, improved: bool) -> bool:
        """Early stopping: whether ``patience`` validated epochs have passed since the last fitness gain."""
        if improved:
            self.best_epoch = epoch
        patience = self.config.patience
        if not (validated and patience) or epoch - self.best_epoch < patience:
            return False
        self._log(f"Stopping early: no fitness gain in the {patience} epochs since epoch {self.best_epoch + 1} "
                  f"(--patience {patience}); its weights are in {self.save_dir / 'weights' / 'best'}.safetensors")
        return True

    def _stopped_by_callback(self, epoch: int) -> bool:
        """Whether a callback set ``trainer.stop``: the run ends after this epoch, as ``--patience`` ends it."""
        if self.stop:
            self._log(f"Stopping after epoch {epoch + 1}: a callback set trainer.stop; the weights are in "
                      f"{self.save_dir / 'weights'}")
        return self.stop

    def _save_period(self, epoch: int) -> None:
        """``--save-period N``: a copy of this epoch's ``last`` checkpoint (without the training state) as
        ``weights/epoch{epoch}`` every N epochs, numbered as the reference numbers them (0-based)."""
        from ..checkpoint import read_metadata, save_checkpoint

        period = self.config.save_period
        if period > 0 and epoch % period == 0:
            metadata, _ = read_metadata(self.save_dir / "weights" / "last")
            save_checkpoint(self.save_dir / "weights" / f"epoch{epoch}", self.model, self.ema.module,
                            metadata=metadata)

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
                    self._load_resumed_state(self.resume_from)
                self._fire("on_params_update", self, self.config.to_dict())
                self._fire("on_pretrain_routine_end", self)
                try:
                    return self._fit()
                except (RuntimeError, ImageReadError) as error:
                    reason = data_loading_failure(error)
                    if reason is None:
                        raise
                    _silence_loader_death_signals()
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

    def _fit(self) -> TrainResult:
        cfg, ctx = self.config, self.ctx
        batches = len(self.train_loader)
        warmup_iters = warmup_iterations(cfg.optim.warmup_epochs, batches)
        nominal_ratio = cfg.optim.nominal_batch / cfg.data.batch_size
        if ctx.is_main:
            (self.save_dir / "weights").mkdir(parents=True, exist_ok=True)
            D.mark_elastic_run(ctx, self.save_dir)
            if self.resume_from is None:
                write_atomic(self.save_dir / "config.yaml",
                             lambda temp: temp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False)))
            self._log(f"Training yolov5{self.model.version} on {self.data_root}: "
                      f"{len(self.train_set)} train / {len(self.val_set)} val images, {cfg.epochs} epochs, "
                      f"batch {cfg.data.batch_size} on {ctx.world_size} process(es), {self.device}; "
                      f"results in {self.save_dir}")
        self._fire("on_train_start", self)
        metrics: dict[str, float] = {}
        epochs_run = 0
        self.best_epoch = self.start_epoch  # a resumed run counts its patience from where it resumes
        for epoch in range(self.start_epoch, cfg.epochs):
            if cfg.augment.close_mosaic and epoch == cfg.epochs - cfg.augment.close_mosaic:
                self.train_set.close_mosaic()
            self.train_sampler.set_epoch(epoch)
            self.ddp.train()
            self._fire("on_train_epoch_start", self, epoch)
            mean_loss = torch.zeros(3, device=self.device)
            progress = tqdm(received(self.train_loader), total=batches, disable=not ctx.is_main, dynamic_ncols=True,
                            bar_format="{l_bar}{bar:10}{r_bar}")
            started = time.perf_counter()
            seen = 0
            for i, (imgs, targets) in enumerate(progress):
                step = i + batches * epoch
                if warmup_iters and step <= warmup_iters:
                    self.accumulate = max(1, round(float(np.interp(step, [0, warmup_iters], [1, nominal_ratio]))))
                    apply_warmup(self.optimizer, step, warmup_iters, self.lf(epoch), cfg.optim)
                self._fire("on_train_batch_start", self, epoch, i)
                imgs, loss = self.train_batch(imgs, targets, epoch, i, step)
                self._fire("on_train_batch_end", self, epoch, i, imgs, targets, loss)
                mean_loss = (mean_loss * i + self._loss_components(loss)) / (i + 1)
                seen += imgs.shape[0] * ctx.world_size
                if ctx.is_main:
                    box, obj, cls = mean_loss.tolist()
                    progress.set_description(
                        f"{epoch + 1}/{cfg.epochs} box {box:.4f} obj {obj:.4f} cls {cls:.4f} "
                        f"inst {targets.shape[0]:3d} size {imgs.shape[-1]:4d} "
                        f"{seen / max(time.perf_counter() - started, 1e-9):6.1f} img/s")
                del loss
            if ctx.enabled:  # results.csv reports the epoch's losses over all processes' images, not rank 0's
                torch.distributed.all_reduce(mean_loss)
                mean_loss /= ctx.world_size
            # The rates this epoch ended with (warm-up included) are the ones results.csv reports.
            self.epoch_lrs = [group["lr"] for group in self.optimizer.param_groups]
            self.scheduler.step()
            epochs_run += 1
            stop = False
            self._fire("on_train_epoch_end", self, epoch)
            if ctx.is_main:
                best_before = self.best_fitness
                metrics = self._end_epoch(epoch, mean_loss)
                self._save_period(epoch)
                stop = (self._no_longer_improving(epoch, bool(metrics), self.best_fitness > best_before)
                        or self._stopped_by_callback(epoch))
            D.barrier(ctx)
            if _agree(ctx, stop):
                break
        result = TrainResult(self.save_dir, self.save_dir / "weights" / "last",
                             self.save_dir / "weights" / "best", epochs_run, metrics)
        self._fire("on_train_end", self, result)
        if ctx.is_main:
            self._log(f"Done: {result.epochs_run} epoch(s). Weights: {result.last}.safetensors, "
                      f"{result.best}.safetensors; results: {self.save_dir / 'results.csv'}")
        return result

    def train_batch(self, imgs: torch.Tensor, targets: torch.Tensor, epoch: int, batch: int,
                    step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One training iteration on a loader batch: forward, loss, backward, and the optimiser and EMA
        update when ``accumulate`` steps have gathered since the last one. Returns the batch as the
        model saw it (device, layout, multi-scale size) and the detached loss."""
        memory_format = torch.channels_last if self.config.channels_last else torch.contiguous_format
        imgs = imgs.to(self.device, non_blocking=True, memory_format=memory_format)
        targets = targets.to(self.device, non_blocking=True)
        if self.config.data.multi_scale:
            imgs = self._multi_scale(imgs, epoch, batch)
        started = time.perf_counter()
        loss = self._step_forward_backward(imgs, targets, epoch, batch, first=step == 0)
        if self.config.compile and not self.first_step_done and self.ctx.is_main:
            self._log(f"torch.compile: the first step took {time.perf_counter() - started:.1f} s, compilation included")
        self.first_step_done = True
        if step - self.last_opt_step >= self.accumulate:
            self._optimizer_step(epoch, batch)
            self.last_opt_step = step
        return imgs, loss

    def _forward_backward(self, imgs: torch.Tensor, targets: torch.Tensor, epoch: int, batch: int) -> torch.Tensor:
        try:
            with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32,
                                enabled=self.amp_dtype is not None):
                outputs = self.forward(imgs)
            loss = self.criterion(outputs, targets, pred_size=imgs.shape[2:4])
            if self.ctx.enabled:
                loss = loss * self.ctx.world_size  # DDP averages gradients; the loss is a sum over images
            self.scaler.scale(loss).backward()
        except DivergenceError as error:
            raise TrainingError(self._divergence_message(epoch, batch, str(error))) from None
        return loss.detach()

    def _loss_components(self, loss: torch.Tensor) -> torch.Tensor:
        """(box, obj, cls) for the progress bar; a custom loss without parts shows its total as 'box'."""
        parts = getattr(self.criterion, "components", None)
        if isinstance(parts, torch.Tensor) and parts.shape == (3,):
            return parts.to(self.device)
        return torch.stack((loss.float() / self.ctx.world_size, loss.new_zeros(()), loss.new_zeros(())))

    def _optimizer_step(self, epoch: int, batch: int) -> None:
        self.scaler.unscale_(self.optimizer)
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=self.config.optim.max_grad_norm)
        # With loss scaling, an overflowed step is skipped by the scaler, not a divergence.
        if not self.scaler.is_enabled() and not bool(torch.isfinite(grad_norm)):
            raise TrainingError(self._divergence_message(epoch, batch, f"gradient norm is {grad_norm.item()}"))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._fire("optimizer_step", self, epoch, batch)
        self._fire("on_before_zero_grad", self, epoch, batch)
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)

    def _divergence_message(self, epoch: int, batch: int, detail: str) -> str:
        lrs = ", ".join(f"{g['lr']:.3g}" for g in self.optimizer.param_groups)
        optim = self.config.optim
        kept = (f"; the last good checkpoint is {self.save_dir / 'weights' / 'last'}.safetensors"
                if (self.save_dir / "weights" / "last.json").exists() else "")
        return (f"training diverged at epoch {epoch + 1}, step {batch + 1} (learning rates {lrs}): {detail}. "
                f"Likely cause: learning rate too high for {optim.optimizer} (lr0={optim.lr0:g}); lower "
                f"--lr0 or lengthen warm-up{kept}")


    def _step_forward_backward(self, imgs: torch.Tensor, targets: torch.Tensor, epoch: int, batch: int,
                               first: bool) -> torch.Tensor:
        """Forward/backward; under the in-place doctor for the first step with ``doctor``, and rerun
        under it when backward fails because a saved tensor was modified in place (a custom loss, say)."""
        from ..doctor import SavedTensorModifiedError, is_inplace_error, run_with_report, watch

        failure = TrainingError("backward failed: a tensor saved for the gradient was modified in place "
                                "(the report above names the lines and the fix)")
        try:
            if first and self.config.doctor and self.ctx.is_main:
                with watch():
                    return self._forward_backward(imgs, targets, epoch, batch)
            return self._forward_backward(imgs, targets, epoch, batch)
        except SavedTensorModifiedError:
            raise failure from None
        except RuntimeError as error:
            if isinstance(error, TrainingError) or not is_inplace_error(error):
                raise
        self.optimizer.zero_grad(set_to_none=True)
        try:
            run_with_report(self._forward_backward, imgs, targets, epoch, batch)
        except SavedTensorModifiedError:
            pass
        raise failure

    def _end_epoch(self, epoch: int, train_loss: torch.Tensor) -> dict[str, float]:
        """Validate the EMA model, log, write results.csv/png, save last (and best) checkpoints."""
        from ..eval.val import val

        cfg = self.config
        final = epoch + 1 == cfg.epochs
        metrics: dict[str, float] = {}
        score = self.best_fitness
        plots = cfg.eval.plots
        if cfg.eval.val or final:
            result = val(self.ema.module, self.val_loader, conf=cfg.eval.conf, iou=cfg.eval.iou,
                         max_det=cfg.eval.max_det, criterion=self.val_criterion, verbose=final,
                         save_dir=self.save_dir if final and plots else None, plots=final and plots,
                         half=self.amp_dtype is not None,  # as the reference: half-precision val under AMP
                         callbacks=self.callbacks)
            metrics = {"precision": result.mp, "recall": result.mr, "mAP50": result.map50, "mAP50-95": result.map}
            metrics.update({f"val_{k}": v for k, v in (result.loss or {}).items()})
            score = result.fitness()
            if not final:
                self._log(f"{'':>12}val: P {result.mp:.3f}  R {result.mr:.3f}  mAP50 {result.map50:.3f}  "
                          f"mAP50-95 {result.map:.3f}")
            if final and plots:
                self._draw_val_predictions()
        row = {"epoch": epoch + 1, **{f"train_{n}": v for n, v in zip(YoloLoss.component_names, train_loss.tolist())},
               **{k: metrics.get(k, "") for k in RESULT_METRICS},
               **{f"lr{j}": lr for j, lr in enumerate(self.epoch_lrs)}}
        self.history.append(row)
        improved = score > self.best_fitness
        self.best_fitness = max(self.best_fitness, score)
        self._fire("on_fit_epoch_end", self, epoch, row, score)
        self._save(epoch, metrics, improved)
        # results.csv, results.png and the loggers are written by the default callbacks here (loggers.py).
        self._fire("on_model_save", self, self.save_dir / "weights" / "last", epoch, final, self.best_fitness, score)
        return metrics

    def _draw_val_predictions(self, count: int = 8) -> None:
        """A few validation images with the final EMA model's detections drawn, for a look by eye."""
        from ..eval.predict import predict

        predict(self.ema.module, self.val_set.im_files[:count], img_size=self.config.data.img_size,
                save_dir=self.save_dir / "val_predictions")

    def _save(self, epoch: int, metrics: dict[str, float], improved: bool) -> None:
        from ..checkpoint import save_checkpoint

        for name, tensor in self.ema.module.state_dict().items():
            if tensor.dtype.is_floating_point and not bool(torch.isfinite(tensor).all()):
                raise TrainingError(f"EMA weight {name} is not finite at epoch {epoch + 1}; not overwriting the "
                                    f"last good checkpoint. Lower --lr0.")
        metadata = {"names": self.names, "img_size": self.config.data.img_size, "epoch": epoch,
                    "train_args": self.config.to_dict(), "metrics": metrics, "best_fitness": self.best_fitness,
                    "ema_updates": self.ema.updates, "history": self.history, "dataset": self.dataset_record}
        weights = self.save_dir / "weights"
        # best before last: a kill between the two repeats the epoch on resume, and so its best save.
        targets = [("best", None)] if improved else []
        targets.append(("last", self._state()))
        for name, state in targets:
            try:
                save_checkpoint(weights / name, self.model, self.ema.module, metadata=metadata, state=state)
            except OSError as error:
                kept = " the previous one is intact and loadable;" if (weights / f"{name}.json").exists() else ""
                raise TrainingError(f"could not save the checkpoint {weights / name} at epoch {epoch + 1} "
                                    f"({error.strerror or error});{kept} free space or fix permissions, then "
                                    f"continue with --resume") from None

    def _state(self) -> dict[str, Any]:
        """Everything besides weights that an exact resume needs, as weights_only-loadable objects."""
        np_state = np.random.get_state()
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "last_opt_step": self.last_opt_step,
            "accumulate": self.accumulate,
            # Gradients accumulated towards the nominal batch but not yet applied: the first step
            # after a resume must see them, as the uninterrupted run's does.
            "grads": [p.grad.detach().cpu() if p.grad is not None else None for p in self.model.parameters()],
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                    "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        }

    def _load_resumed_state(self, path: Path) -> None:
        from ..checkpoint import load_state, read_checkpoint

        contents = read_checkpoint(path)
        state = load_state(path)
        self.model.load_state_dict(contents.model_state)
        if self.ema is not None:
            self.ema.module.load_state_dict(contents.ema_state or contents.model_state)
            self.ema.updates = int(contents.metadata["ema_updates"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.last_opt_step = int(state["last_opt_step"])
        self.accumulate = int(state["accumulate"])
        for param, grad in zip(self.model.parameters(), state["grads"]):
            param.grad = grad.to(param.device) if grad is not None else None
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(_as_tuple(rng["python"]))
        name, keys, *rest = rng["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.start_epoch = int(contents.metadata["epoch"]) + 1
        self.best_fitness = float(contents.metadata["best_fitness"])
        self.history = list(contents.metadata.get("history") or [])
        if self.ctx.is_main:
            self._log(f"Resuming {self.save_dir} from epoch {self.start_epoch + 1}/{self.config.epochs}")

    def _log(self, message: str) -> None:
        tqdm.write(message)


def autocast_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of an ``amp`` setting on ``device`` (``None``: full float32)."""
    if amp == "auto":
        return torch.float16 if device.type == "cuda" else None
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError("amp fp16 needs a CUDA device; on the CPU use amp bf16")
    return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]


def _with_new_head(model: Yolov5, num_classes: int) -> Yolov5:
    """Same backbone and neck for another class count; the Detect convolutions start fresh."""
    anchors = model.head.anchors * model.head.stride.view(-1, 1, 1)
    fresh = Yolov5(model.spec, num_classes=num_classes, anchors=anchors, in_channels=model.in_channels)
    head_convs = f"model.{len(model.model) - 1}.m."
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(head_convs)}
    fresh.load_state_dict(state, strict=False)  # same architecture: only the head convolutions are missing
    return fresh


def _agree(ctx: D.DistributedContext, flag: bool) -> bool:
    """Rank 0's ``flag`` on every process (all stop training together)."""
    if not ctx.enabled:
        return flag
    decision = [flag]
    torch.distributed.broadcast_object_list(decision, src=0)
    return bool(decision[0])


class LoaderProcessError(RuntimeError):
    """A batch could not be received from a loader process (it died while handing the batch over)."""


def received(loader: DataLoader) -> Iterator[Any]:
    """The batches of ``loader``. A loader process that dies while a batch is being handed over can leave
    the transfer failing before torch notices the death; that failure becomes a :class:`LoaderProcessError`."""
    batches: Iterator[Any] = iter(loader)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, EOFError) as error:
            if loader.num_workers == 0 or "Original Traceback" in str(error):
                raise  # the dataset's own error (raised in a loader process, re-raised here with its traceback)
            raise LoaderProcessError(f"a batch could not be received: {type(error).__name__}: {error}") from error
        yield batch


def data_loading_failure(error: BaseException) -> str | None:
    """What went wrong, in one line, when ``error`` means the data could no longer be loaded (a loader
    process died, an image vanished); None for any other error."""
    text = str(error).strip()
    if isinstance(error, LoaderProcessError) or (isinstance(error, RuntimeError)
                                                 and text.startswith("DataLoader worker (pid")):
        # torch's own line, from its SIGCHLD handler or from the loader noticing the process is gone
        return f"a data-loading process died ({text.splitlines()[0].rstrip('. ')}; --workers 0 loads in the " \
               "training process)"
    if isinstance(error, ImageReadError):
        # Raised in a loader process, it arrives with that process's traceback; its last line is the message.
        return text.splitlines()[-1].partition(": ")[2] if "Original Traceback" in text else text
    return None


def _silence_loader_death_signals() -> None:
    """After a loader process died, stop torch's SIGCHLD handler from raising again: it raises for the dead
    process at every later child exit (the other loader processes shutting down), which would interrupt
    the clean-up and the one-line error with a traceback. Signal handlers live in the main thread only."""
    if hasattr(signal, "SIGCHLD") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _as_tuple(value: Any) -> Any:
    """Python's RNG state is nested tuples; a saved copy may come back with lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


# The names of a run's last checkpoint set, the one --resume continues.
RESUME_NAMES = frozenset({"last", "last.json", "last.safetensors", "last.state.pt"})


def find_resume_checkpoint(resume: str | os.PathLike | bool, project: str | os.PathLike = TrainConfig.project) -> Path:
    """``resume=True``: the newest ``weights/last`` under ``project``; else the given run folder or its
    ``weights/last`` checkpoint (any file of the set). Anything else is refused: the run folder a resume
    writes into is the checkpoint's grandparent, so it must be one."""
    if resume is not True and str(resume).lower() not in ("true", "1"):
        path = Path(resume)
        if path.is_dir():
            path = path / "weights" / "last.json"
        elif path.name not in RESUME_NAMES or path.parent.name != "weights":
            raise FileNotFoundError(f"--resume takes a run folder or the weights/last checkpoint inside one, "
                                    f"not {path}")
        path = path.with_name("last.json")
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint to resume at {path}")
        return path
    candidates = sorted(Path(project).glob("*/weights/last.json"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise FileNotFoundError(f"no run to resume: no */weights/last.json under {project}")
    return candidates[-1]


def resume_training(path: str | os.PathLike, *, device: str | None = None, workers: int | None = None,
           loss: Callable[[Yolov5, bool], Callable] | None = None,
           accept_changed_data: bool = ResumeOptions.accept_changed_data) -> Trainer:
    """A trainer that continues the run of a ``last`` checkpoint with the configuration saved in it, on
    the dataset at the location it recorded (whatever the working folder is now); only where it runs
    (``device``, ``workers``) may change, and the data only with ``accept_changed_data``."""
    from ..checkpoint import CheckpointError, read_metadata

    path = Path(path)
    metadata, has_state = read_metadata(path)
    if not has_state:
        raise TrainingError(f"{path}: has no training state to resume from (is it a 'best' checkpoint?)")
    try:
        saved = TrainConfig.from_dict(metadata.get("train_args"))
    except ConfigError as error:
        raise CheckpointError(f"{path}: the saved run settings are not valid ({error})") from None
    if int(metadata["epoch"]) + 1 >= saved.epochs:
        raise TrainingError(f"{path}: that run already finished all {saved.epochs} epochs; nothing to resume")
    recorded = metadata.get("dataset")
    if recorded is not None and record_problem(recorded):
        raise CheckpointError(f"{path}: field 'dataset' {record_problem(recorded)}")
    if recorded is not None and recorded["path"] is not None and saved.data.path is not None:
        saved = dataclasses.replace(saved, data=dataclasses.replace(saved.data, path=recorded["path"]))
    return Trainer(with_runtime(saved, device, workers), loss=loss, resume_from=path,
                   accept_changed_data=accept_changed_data)


# What may accompany ``resume``: where the run goes on, and where to look for it.
RESUME_SETTINGS = frozenset({"device", "workers", "project"})


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
    from ..checkpoint import read_metadata

    ctx = D.context_from_env()
    run_dir = D.elastic_run_dir(ctx, project)
    if run_dir is None:
        return None
    last = run_dir / "weights" / "last.json"
    if last.is_file():
        metadata, _ = read_metadata(last)
        if int(metadata["epoch"]) + 1 < int(metadata["train_args"]["epochs"]):
            return resume_training(last, device=device, workers=workers, loss=loss)
        if not ctx.restart_count:
            return None  # a finished run of an earlier job under the same id: this launch starts its own
        if ctx.is_main:
            tqdm.write(f"{run_dir} finished all its epochs before the restart; nothing left to train")
        return TrainResult(run_dir, run_dir / "weights" / "last", run_dir / "weights" / "best", 0,
                           dict(metadata.get("metrics") or {}))
    if config is None:
        return None
    return Trainer(dataclasses.replace(config, project=str(run_dir.parent), name=run_dir.name, exist_ok=True),
                   loss=loss)
