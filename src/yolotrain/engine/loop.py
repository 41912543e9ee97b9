"""The epoch loop of a trainer: warm-up, the steps, the epoch's end (validation, results row, checkpoints,
periodic copies), early stopping, and the one-line errors of data that can no longer be loaded."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import yaml
from torch.utils.data import DataLoader

from ..atomic import write_atomic
from ..checkpoint import read_metadata, save_checkpoint
from ..data.dataset import ImageReadError
from ..data.loaders import image_weights
from ..eval.val import val
from ..model.layered import PRECISIONS
from ..model.summary import summarise
from ..prediction.run import predict
from ..progress import progress_bar
from . import distributed as D
from .optim import apply_warmup, warmup_iterations
from .plots import TRAIN_BATCH_PLOTS
from .results import TrainResult

if TYPE_CHECKING:
    from .trainer import Trainer


def run_epochs(trainer: Trainer) -> TrainResult:
    """Train ``trainer`` (set up, its resumed state loaded) from its start epoch to the last one, or until
    patience or a callback stops it."""
    cfg, ctx, state = trainer.config, trainer.ctx, trainer.state
    batches = len(trainer.train_loader)
    warmup_iters = warmup_iterations(cfg.optim.warmup_epochs, batches)
    nominal_ratio = cfg.optim.nominal_batch / cfg.data.batch_size
    if ctx.is_main:
        (trainer.save_dir / "weights").mkdir(parents=True, exist_ok=True)
        D.mark_elastic_run(ctx, trainer.save_dir)
        if trainer.resume_from is None:
            write_atomic(trainer.save_dir / "config.yaml",
                         lambda temp: temp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False)))
        model_name = trainer.task.model_label(trainer.model)
        trainer._log(f"Training {model_name} on {trainer.data_root}: "
                     f"{len(trainer.train_set)} train / {len(trainer.val_set)} val images, {cfg.epochs} epochs, "
                     f"batch {cfg.data.batch_size} on {ctx.world_size} process(es), {trainer.device}; "
                     f"results in {trainer.save_dir}")
        trainer._log(str(summarise(trainer.model, model_name, cfg.data.img_size, trainer.model.in_channels)))
        if trainer.resume_from is None and cfg.eval.plots:  # once per run, as the reference plots them
            trainer.task.save_training_labels(trainer.save_dir / "labels.jpg", trainer.train_set.labels,
                                              trainer.names)
    trainer._fire("on_train_start", trainer)
    metrics: dict[str, float] = {}
    epochs_run = 0
    trainer.best_epoch = state.start_epoch  # a resumed run counts its patience from where it resumes
    for epoch in range(state.start_epoch, cfg.epochs):
        if cfg.augment.close_mosaic and epoch == cfg.epochs - cfg.augment.close_mosaic:
            trainer.train_set.close_mosaic()
        trainer.train_sampler.set_epoch(epoch)
        if cfg.data.image_weights:
            _draw_by_image_weights(trainer)
        trainer.ddp.train()
        trainer._fire("on_train_epoch_start", trainer, epoch)
        names = trainer.step.component_names
        mean_loss = torch.zeros(len(names), device=trainer.device)
        progress = progress_bar(received(trainer.train_loader), total=batches, enabled=ctx.is_main, logged=True)
        started = time.perf_counter()
        seen = 0
        for i, batch in enumerate(progress):
            step = i + batches * epoch
            if warmup_iters and step <= warmup_iters:
                state.accumulate = max(1, round(float(np.interp(step, [0, warmup_iters], [1, nominal_ratio]))))
                apply_warmup(state.optimizer, step, warmup_iters, trainer.lf(epoch), cfg.optim)
            trainer._fire("on_train_batch_start", trainer, epoch, i)
            imgs, loss = trainer.train_batch(batch, epoch, i, step)
            targets = batch.targets
            trainer._fire("on_train_batch_end", trainer, epoch, i, imgs, targets, loss)
            if step < TRAIN_BATCH_PLOTS and cfg.eval.plots and ctx.is_main:  # the task draws its batches, if any
                trainer.task.save_training_batch(trainer.save_dir / f"train_batch{step}.jpg",
                                                 dataclasses.replace(batch, imgs=imgs), trainer.names, cfg)
            mean_loss = (mean_loss * i + trainer.step.loss_components(loss)) / (i + 1)
            seen += imgs.shape[0] * ctx.world_size
            if ctx.is_main:
                parts = " ".join(f"{name} {value:.4f}" for name, value in zip(names, mean_loss.tolist()))
                progress.set_description(
                    f"{epoch + 1}/{cfg.epochs} {parts} "
                    f"inst {targets.shape[0]:3d} size {imgs.shape[-1]:4d} "
                    f"{seen / max(time.perf_counter() - started, 1e-9):6.1f} img/s")
            del loss
        if ctx.enabled:  # results.csv reports the epoch's losses over all processes' images, not rank 0's
            torch.distributed.all_reduce(mean_loss)
            mean_loss /= ctx.world_size
        # The rates this epoch ended with (warm-up included) are the ones results.csv reports.
        trainer.epoch_lrs = [group["lr"] for group in state.optimizer.param_groups]
        state.scheduler.step()
        epochs_run += 1
        stop = False
        trainer._fire("on_train_epoch_end", trainer, epoch)
        if ctx.is_main:
            best_before = state.best_fitness
            metrics = end_epoch(trainer, epoch, mean_loss)
            _save_period(trainer, epoch)
            stop = (_no_longer_improving(trainer, epoch, bool(metrics), state.best_fitness > best_before)
                    or _stopped_by_callback(trainer, epoch))
        D.barrier(ctx)
        if _agree(ctx, stop):
            break
    result = TrainResult(trainer.save_dir, trainer.save_dir / "weights" / "last",
                         trainer.save_dir / "weights" / "best", epochs_run, metrics)
    trainer._fire("on_train_end", trainer, result)
    if ctx.is_main:
        trainer._log(f"Done: {result.epochs_run} epoch(s). Weights: {result.last}.safetensors, "
                     f"{result.best}.safetensors; results: {trainer.save_dir / 'results.csv'}")
    return result


def end_epoch(trainer: Trainer, epoch: int, train_loss: torch.Tensor) -> dict[str, float]:
    """Validate the EMA model, log, write results.csv/png, save last (and best) checkpoints."""
    cfg, state, task = trainer.config, trainer.state, trainer.task
    final = epoch + 1 == cfg.epochs
    metrics: dict[str, float] = {}
    score = state.best_fitness
    plots = cfg.eval.plots
    if cfg.eval.val or final:
        result = val(state.ema.module, trainer.val_loader, conf=cfg.eval.conf, iou=cfg.eval.iou,
                     max_det=cfg.eval.max_det, criterion=trainer.val_criterion, verbose=final,
                     save_dir=trainer.save_dir if final and plots else None, plots=final and plots,
                     half=trainer.amp_dtype is not None,  # as the reference: half-precision val under AMP
                     callbacks=trainer.callbacks)
        metrics = task.result_values(result)
        score = result.fitness()
        if hasattr(result, "class_maps"):  # per-class mAPs, which --image-weights draws by
            state.class_maps = result.class_maps().tolist()
        if not final:
            trainer._log(f"{'':>12}val: {task.result_summary(result)}")
        if final and plots:
            _draw_val_predictions(trainer)
    row = {"epoch": epoch + 1, **{f"train_{n}": v for n, v in zip(trainer.step.component_names, train_loss.tolist())},
           **{k: metrics.get(k, "") for k in (*task.result_columns,
                                               *(f"val_{n}" for n in trainer.step.component_names))},
           **{f"lr{j}": lr for j, lr in enumerate(trainer.epoch_lrs)}}
    state.history.append(row)
    improved = score > state.best_fitness
    state.best_fitness = max(state.best_fitness, score)
    trainer._fire("on_fit_epoch_end", trainer, epoch, row, score)
    state.save(trainer.save_dir / "weights", epoch, metrics, improved,
               {"names": trainer.names, "img_size": cfg.data.img_size, "train_args": cfg.to_dict(),
                "dataset": trainer.dataset_record, "precision": PRECISIONS[trainer.amp_dtype or torch.float32]})
    # results.csv, results.png and the loggers are written by the default callbacks here (loggers.py).
    trainer._fire("on_model_save", trainer, trainer.save_dir / "weights" / "last", epoch, final,
                  state.best_fitness, score)
    return metrics


def _draw_by_image_weights(trainer: Trainer) -> None:
    """``--image-weights``: this epoch's images drawn by the weights of their classes after the last validation
    (rank 0's, as it alone validates), the same draw on every process."""
    state = trainer.state
    if trainer.ctx.enabled:
        maps = [state.class_maps]
        torch.distributed.broadcast_object_list(maps, src=0)
        state.class_maps = maps[0]
    labels = trainer.train_set.labels
    trainer.train_sampler.image_weights = image_weights(labels, len(trainer.names), state.class_maps)


def _draw_val_predictions(trainer: Trainer, count: int = 8) -> None:
    """A few validation images with the final EMA model's detections drawn, for a look by eye."""
    predict(trainer.state.ema.module, trainer.val_set.im_files[:count], img_size=trainer.config.data.img_size,
            save_dir=trainer.save_dir / "val_predictions")


def _save_period(trainer: Trainer, epoch: int) -> None:
    """``--save-period N``: a copy of this epoch's ``last`` checkpoint (without the training state) as
    ``weights/epoch{epoch}`` every N epochs, numbered as the reference numbers them (0-based)."""
    period = trainer.config.save_period
    if period > 0 and epoch % period == 0:
        metadata, _ = read_metadata(trainer.save_dir / "weights" / "last")
        save_checkpoint(trainer.save_dir / "weights" / f"epoch{epoch}", trainer.model, trainer.state.ema.module,
                        metadata=metadata)


def _no_longer_improving(trainer: Trainer, epoch: int, validated: bool, improved: bool) -> bool:
    """Early stopping: whether ``patience`` validated epochs have passed since the last fitness gain."""
    if improved:
        trainer.best_epoch = epoch
    patience = trainer.config.patience
    if not (validated and patience) or epoch - trainer.best_epoch < patience:
        return False
    trainer._log(f"Stopping early: no fitness gain in the {patience} epochs since epoch {trainer.best_epoch + 1} "
                 f"(--patience {patience}); its weights are in {trainer.save_dir / 'weights' / 'best'}.safetensors")
    return True


def _stopped_by_callback(trainer: Trainer, epoch: int) -> bool:
    """Whether a callback set ``trainer.stop``: the run ends after this epoch, as ``--patience`` ends it."""
    if trainer.stop:
        trainer._log(f"Stopping after epoch {epoch + 1}: a callback set trainer.stop; the weights are in "
                     f"{trainer.save_dir / 'weights'}")
    return trainer.stop


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


def silence_loader_death_signals() -> None:
    """After a loader process died, stop torch's SIGCHLD handler from raising again: it raises for the dead
    process at every later child exit (the other loader processes shutting down), which would interrupt
    the clean-up and the one-line error with a traceback. Signal handlers live in the main thread only."""
    if hasattr(signal, "SIGCHLD") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
