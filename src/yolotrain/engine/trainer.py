"""The training loop: the reference YOLOv5 recipe on one process or many (torchrun)."""

from __future__ import annotations

import csv
import dataclasses
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from ..data.augment import HYP_SCRATCH_LOW
from ..data.dataset import DetectionDataset
from ..data.loaders import make_loader
from ..data.sources import resolve_source
from ..data.verify import verify_split
from ..devices import select_device
from ..loss import DivergenceError, YoloLoss
from ..model import Yolov5, parse_version
from ..runs import next_run_dir
from . import distributed as D
from .config import TrainConfig, load_hyp
from .ema import ModelEMA
from .optim import DEFAULT_LR0, apply_warmup, build_optimizer, lr_lambda, warmup_iterations

# Validation columns of results.csv (left empty in epochs that skip validation).
RESULT_METRICS = ("precision", "recall", "mAP50", "mAP50-95", "val_box", "val_obj", "val_cls")


class TrainingError(RuntimeError):
    """Training cannot go on (diverged, bad configuration); the message says why and what to do."""


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
                 loss: Callable[[Yolov5, bool], Callable] | None = None) -> None:
        """``loss(model, rect_training)`` builds a custom training criterion (default: :class:`YoloLoss`
        with the run's hyper-parameters); it is called as ``criterion(outputs, targets, pred_size=...)``
        and must return a scalar."""
        self.loss_factory = loss
        self.img_size_given = config.img_size is not None
        self.config = config.resolved()
        self.ctx = ctx or D.context_from_env()
        self.device = select_device(self.config.device, self.ctx.local_rank)
        cfg = self.config
        if cfg.img_size % 32:
            raise ValueError(f"image size must be a multiple of 32, got {cfg.img_size}")
        if cfg.batch_size < 1 or cfg.epochs < 1:
            raise ValueError(f"batch size and epochs must be at least 1, got {cfg.batch_size} and {cfg.epochs}")
        if cfg.batch_size % self.ctx.world_size:
            raise ValueError(f"batch {cfg.batch_size} is not divisible by {self.ctx.world_size} processes")
        if not (Path(cfg.model).suffix or Path(cfg.model).exists()):
            parse_version(cfg.model)  # an unknown model name fails now, not after the data scan
        self.hyp = load_hyp({**(load_hyp(cfg.hyp_file) if cfg.hyp_file else {}), **cfg.hyp})
        self.lr0 = cfg.lr0 if cfg.lr0 is not None else DEFAULT_LR0.get(cfg.optimizer, 0.01)

    # ----------------------------------------------------------------------------------- data
    def _build_data(self) -> None:
        cfg = self.config
        root = cfg.data
        if root is None:
            from ..data.shapes import generate_shapes_dataset

            root = str(generate_shapes_dataset())
        source = resolve_source(root)
        self.names = list(source.names)
        num_classes = len(self.names)
        if num_classes == 0:
            raise ValueError(f"{root}: the dataset defines no class names")
        self.model = self._build_model()
        cfg = self._fit_img_size(self.model.max_stride)
        train_index = verify_split(source.train, num_classes, "train")
        if len(train_index.files) == 0:
            raise ValueError(f"{root}: the training split has no usable images")
        val_index = train_index if source.val == source.train else verify_split(source.val, num_classes, "val")
        aug = {k: self.hyp[k] for k in HYP_SCRATCH_LOW}
        self.train_set = DetectionDataset(train_index, cfg.img_size, cfg.batch_size, augment=True, hyp=aug,
                                          rect=cfg.rect, pad=0.0, seed=cfg.seed, names=self.names,
                                          stride=self.model.max_stride)
        self.val_set = DetectionDataset(val_index, cfg.img_size, cfg.batch_size, augment=False, rect=True,
                                        pad=0.5, seed=cfg.seed, names=self.names, stride=self.model.max_stride)
        workers = min(2, os.cpu_count() or 1) if cfg.workers is None else cfg.workers
        self.train_loader = make_loader(self.train_set, cfg.batch_size, True, workers, cfg.seed,
                                        self.ctx.rank, self.ctx.world_size)
        self.train_sampler = self.train_loader.batch_sampler
        # Validation runs on rank 0 alone, over the whole split.
        self.val_loader = make_loader(self.val_set, cfg.batch_size, False, workers, cfg.seed)
        self.data_root = root

    # ---------------------------------------------------------------------------------- model
    def _fit_img_size(self, stride: int) -> TrainConfig:
        """Image size for the model's largest stride: by default the size its published weights were trained
        at (1280 for P6) on a dataset, the shapes default rounded up to the stride; a given size must fit."""
        cfg = self.config
        if not (self.img_size_given or cfg.resume):
            size = self.model.default_img_size if cfg.data is not None else -(-cfg.img_size // stride) * stride
            self.config = cfg = dataclasses.replace(cfg, img_size=size)
        elif cfg.img_size % stride:
            raise ValueError(f"image size must be a multiple of {stride} (the model's largest stride), "
                             f"got {cfg.img_size}")
        return cfg

    def _build_model(self) -> Yolov5:
        spec = self.config.model
        if Path(spec).suffix in (".yaml", ".yml"):
            return Yolov5.from_yaml(spec, num_classes=len(self.names), names=self.names)
        if Path(spec).suffix or Path(spec).exists():
            from ..interop import load_model

            model = load_model(spec)
            if model.num_classes != len(self.names):
                model = _with_new_head(model, len(self.names))
            model.names = list(self.names)
            return model
        return Yolov5(version=spec, num_classes=len(self.names), names=self.names)

    def _setup(self) -> None:
        cfg, ctx = self.config, self.ctx
        D.init_process_group(ctx, self.device)
        # Per-rank seeds: augmentations differ by sample index already, global RNGs differ by rank.
        seed_everything(cfg.seed + ctx.rank)
        self._build_data()
        cfg, model = self.config, self.model.to(self.device)  # the image size may now fit the model's stride
        if cfg.sync_bn and ctx.enabled:
            if self.device.type != "cuda":
                raise ValueError("--sync-bn needs CUDA devices (PyTorch has no SyncBatchNorm on the CPU)")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.model = model
        self.ddp = (nn.parallel.DistributedDataParallel(model, device_ids=[self.device] if self.device.type == "cuda"
                                                         else None) if ctx.enabled else model)
        self.accumulate = max(round(cfg.nominal_batch / cfg.batch_size), 1)
        weight_decay = self.hyp["weight_decay"] * cfg.batch_size * self.accumulate / cfg.nominal_batch
        self.optimizer = build_optimizer(model, cfg.optimizer, self.lr0, self.hyp["momentum"], weight_decay)
        self.lf = lr_lambda(cfg.epochs, self.hyp["lrf"], cfg.cos_lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda=self.lf)
        self.ema = ModelEMA(model) if ctx.is_main else None
        self.amp = self.device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp)
        loss_hyp = {k: self.hyp[k] for k in ("box", "cls", "obj", "anchor_t")}
        self.criterion = (self.loss_factory(model, cfg.rect) if self.loss_factory is not None
                          else YoloLoss(model, rect_training=cfg.rect, img_size=cfg.img_size, hyp=loss_hyp))
        self.val_criterion = (YoloLoss(self.ema.module, rect_training=True, img_size=cfg.img_size, hyp=loss_hyp)
                              if self.ema is not None else None)
        self.start_epoch = 0
        self.best_fitness = -1.0
        self.last_opt_step = -1
        self.save_dir = next_run_dir(cfg.project, cfg.name, cfg.exist_ok)

    # ----------------------------------------------------------------------------------- loop
    def fit(self) -> TrainResult:
        """Train for the configured epochs; returns where the weights and results were written."""
        resume_from = find_resume_checkpoint(self.config) if self.config.resume else None
        if resume_from is not None:
            self._adopt_resumed_config(resume_from)
        try:
            self._setup()
            if resume_from is not None:
                self._load_resumed_state(resume_from)
            return self._fit()
        finally:
            D.destroy_process_group()

    def _fit(self) -> TrainResult:
        cfg, ctx = self.config, self.ctx
        batches = len(self.train_loader)
        warmup_iters = warmup_iterations(self.hyp["warmup_epochs"], batches)
        if ctx.is_main:
            (self.save_dir / "weights").mkdir(parents=True, exist_ok=True)
            self._log(f"Training yolov5{self.model.version} on {self.data_root}: "
                      f"{len(self.train_set)} train / {len(self.val_set)} val images, {cfg.epochs} epochs, "
                      f"batch {cfg.batch_size} on {ctx.world_size} process(es), {self.device}; "
                      f"results in {self.save_dir}")
        metrics: dict[str, float] = {}
        for epoch in range(self.start_epoch, cfg.epochs):
            if cfg.close_mosaic and epoch == cfg.epochs - cfg.close_mosaic:
                self.train_set.close_mosaic()
            self.train_sampler.set_epoch(epoch)
            self.ddp.train()
            mean_loss = torch.zeros(3, device=self.device)
            progress = tqdm(self.train_loader, total=batches, disable=not ctx.is_main, dynamic_ncols=True,
                            bar_format="{l_bar}{bar:10}{r_bar}")
            started = time.perf_counter()
            seen = 0
            for i, (imgs, targets) in enumerate(progress):
                step = i + batches * epoch
                imgs = imgs.to(self.device, non_blocking=True)
                targets = targets.to(self.device)
                if warmup_iters and step <= warmup_iters:
                    self.accumulate = max(1, round(float(np.interp(step, [0, warmup_iters],
                                                                   [1, cfg.nominal_batch / cfg.batch_size]))))
                    apply_warmup(self.optimizer, step, warmup_iters, self.lf(epoch), self.hyp)
                loss = self._step_forward_backward(imgs, targets, epoch, i, first=step == 0)
                if step - self.last_opt_step >= self.accumulate:
                    self._optimizer_step(epoch, i)
                    self.last_opt_step = step
                mean_loss = (mean_loss * i + self._loss_components(loss)) / (i + 1)
                seen += imgs.shape[0] * ctx.world_size
                if ctx.is_main:
                    box, obj, cls = mean_loss.tolist()
                    progress.set_description(
                        f"{epoch + 1}/{cfg.epochs} box {box:.4f} obj {obj:.4f} cls {cls:.4f} "
                        f"inst {targets.shape[0]:3d} size {imgs.shape[-1]:4d} "
                        f"{seen / max(time.perf_counter() - started, 1e-9):6.1f} img/s")
                del loss
            self.scheduler.step()
            if ctx.is_main:
                metrics = self._end_epoch(epoch, mean_loss)
            D.barrier(ctx)
        result = TrainResult(self.save_dir, self.save_dir / "weights" / "last",
                             self.save_dir / "weights" / "best", cfg.epochs - self.start_epoch, metrics)
        if ctx.is_main:
            self._log(f"Done: {result.epochs_run} epoch(s). Weights: {result.last}.safetensors, "
                      f"{result.best}.safetensors; results: {self.save_dir / 'results.csv'}")
        return result

    def _forward_backward(self, imgs: torch.Tensor, targets: torch.Tensor, epoch: int, batch: int) -> torch.Tensor:
        try:
            with torch.autocast(self.device.type, enabled=self.amp):
                loss = self.criterion(self.ddp(imgs), targets, pred_size=imgs.shape[2:4])
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
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=self.config.max_grad_norm)
        if not self.amp and not bool(torch.isfinite(grad_norm)):
            raise TrainingError(self._divergence_message(epoch, batch, f"gradient norm is {grad_norm.item()}"))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)

    def _divergence_message(self, epoch: int, batch: int, detail: str) -> str:
        lrs = ", ".join(f"{g['lr']:.3g}" for g in self.optimizer.param_groups)
        kept = (f"; the last good checkpoint is {self.save_dir / 'weights' / 'last'}.safetensors"
                if (self.save_dir / "weights" / "last.json").exists() else "")
        return (f"training diverged at epoch {epoch + 1}, step {batch + 1} (learning rates {lrs}): {detail}. "
                f"Likely cause: learning rate too high for {self.config.optimizer} (lr0={self.lr0:g}); lower "
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
        if cfg.val or final:
            result = val(self.ema.module, self.val_loader, criterion=self.val_criterion, verbose=final,
                         save_dir=self.save_dir if final and cfg.plots else None, plots=final and cfg.plots)
            metrics = {"precision": result.mp, "recall": result.mr, "mAP50": result.map50, "mAP50-95": result.map}
            metrics.update({f"val_{k}": v for k, v in (result.loss or {}).items()})
            score = result.fitness()
            if not final:
                self._log(f"{'':>12}val: P {result.mp:.3f}  R {result.mr:.3f}  mAP50 {result.map50:.3f}  "
                          f"mAP50-95 {result.map:.3f}")
            if final and cfg.plots:
                self._draw_val_predictions()
        row = {"epoch": epoch + 1, **{f"train_{n}": v for n, v in zip(YoloLoss.component_names, train_loss.tolist())},
               **{k: metrics.get(k, "") for k in RESULT_METRICS},
               **{f"lr{j}": g["lr"] for j, g in enumerate(self.optimizer.param_groups)}}
        self._append_results(row)
        improved = score > self.best_fitness
        self.best_fitness = max(self.best_fitness, score)
        self._save(epoch, metrics, improved)
        if cfg.plots:
            from .plots import plot_results

            plot_results(self.save_dir / "results.csv", self.save_dir / "results.png")
        return metrics

    def _draw_val_predictions(self, count: int = 8) -> None:
        """A few validation images with the final EMA model's detections drawn, for a look by eye."""
        from ..eval.predict import predict

        predict(self.ema.module, self.val_set.im_files[:count], img_size=self.config.img_size,
                save_dir=self.save_dir / "val_predictions")

    def _append_results(self, row: dict[str, float]) -> None:
        path = self.save_dir / "results.csv"
        new = not path.exists()
        with path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})

    def _save(self, epoch: int, metrics: dict[str, float], improved: bool) -> None:
        from ..checkpoint import save_checkpoint

        for name, tensor in self.ema.module.state_dict().items():
            if tensor.dtype.is_floating_point and not bool(torch.isfinite(tensor).all()):
                raise TrainingError(f"EMA weight {name} is not finite at epoch {epoch + 1}; not overwriting the "
                                    f"last good checkpoint. Lower --lr0.")
        metadata = {"names": self.names, "img_size": self.config.img_size, "epoch": epoch,
                    "train_args": self.config.to_dict(), "metrics": metrics, "best_fitness": self.best_fitness,
                    "ema_updates": self.ema.updates}
        weights = self.save_dir / "weights"
        save_checkpoint(weights / "last", self.model, self.ema.module, metadata=metadata, state=self._state())
        if improved:
            save_checkpoint(weights / "best", self.model, self.ema.module, metadata=metadata)

    def _state(self) -> dict[str, Any]:
        """Everything besides weights that an exact resume needs, as weights_only-loadable objects."""
        np_state = np.random.get_state()
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "last_opt_step": self.last_opt_step,
            "accumulate": self.accumulate,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                    "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        }

    def _adopt_resumed_config(self, path: Path) -> None:
        """Continue with the run's own settings; only where it runs (device, workers) may change."""
        from ..checkpoint import read_metadata

        metadata, has_state = read_metadata(path)
        if not has_state:
            raise TrainingError(f"{path}: has no training state to resume from (is it a 'best' checkpoint?)")
        saved = TrainConfig.from_dict(metadata["train_args"])
        if metadata["epoch"] + 1 >= saved.epochs:
            raise TrainingError(f"{path}: that run already finished all {saved.epochs} epochs; nothing to resume")
        current = self.config
        self.config = dataclasses.replace(saved, device=current.device, workers=current.workers, resume=str(path))
        self.resume_dir = path.parent.parent

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
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(_as_tuple(rng["python"]))
        name, keys, *rest = rng["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.start_epoch = int(contents.metadata["epoch"]) + 1
        self.best_fitness = float(contents.metadata["best_fitness"])
        self.save_dir = self.resume_dir
        if self.ctx.is_main:
            self._log(f"Resuming {self.save_dir} from epoch {self.start_epoch + 1}/{self.config.epochs}")

    def _log(self, message: str) -> None:
        tqdm.write(message)


def _with_new_head(model: Yolov5, num_classes: int) -> Yolov5:
    """Same backbone and neck for another class count; the Detect convolutions start fresh."""
    anchors = model.head.anchors * model.head.stride.view(-1, 1, 1)
    fresh = Yolov5(model.spec, num_classes=num_classes, anchors=anchors, in_channels=model.in_channels)
    head_convs = f"model.{len(model.model) - 1}.m."
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(head_convs)}
    fresh.load_state_dict(state, strict=False)  # same architecture: only the head convolutions are missing
    return fresh


def _as_tuple(value: Any) -> Any:
    """Python's RNG state is nested tuples; a saved copy may come back with lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def find_resume_checkpoint(config: TrainConfig) -> Path:
    """``resume=True``: the newest ``weights/last`` under the project folder; else the given path."""
    if config.resume is not True and str(config.resume).lower() not in ("true", "1"):
        path = Path(str(config.resume))
        if path.is_dir():
            path = path / "weights" / "last.json"
        if not path.name.endswith(".json"):
            path = path.with_name(path.name.removesuffix(".safetensors").removesuffix(".state.pt") + ".json")
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint to resume at {path}")
        return path
    candidates = sorted(Path(config.project).glob("*/weights/last.json"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise FileNotFoundError(f"no run to resume: no */weights/last.json under {config.project}")
    return candidates[-1]


def train(config: TrainConfig | None = None, loss: Callable[[Yolov5, bool], Callable] | None = None,
          **overrides: Any) -> TrainResult:
    """Train a detector: ``yolotrain.train(data="data.yaml", model="yolov5s", epochs=50)``.

    ``loss`` optionally builds a custom criterion from ``(model, rect_training)``.
    """
    config = dataclasses.replace(config or TrainConfig(), **overrides)
    return Trainer(config, loss=loss).fit()
