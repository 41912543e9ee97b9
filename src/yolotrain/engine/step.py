"""One training step on one batch: forward, loss, backward, and, once ``accumulate`` batches have
gathered, the clipped optimiser step and the EMA update. A backward that fails because a saved tensor was
modified in place is rerun under the in-place doctor, whose report names the lines."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from ..doctor import DoctorError, SavedTensorModifiedError, is_inplace_error, run_with_report, watch
from ..loss import DivergenceError
from . import distributed as D
from .config import TrainConfig
from .results import TrainingError
from .state import TrainState


class TrainStep:
    """The step of one run. ``forward`` is the module that runs the training forward (DDP-wrapped or
    compiled); ``fire(hook, *args)`` runs the callbacks of ``hook`` with the trainer first."""

    def __init__(self, config: TrainConfig, ctx: D.DistributedContext, device: torch.device,
                 amp_dtype: torch.dtype | None, state: TrainState, forward: Callable[[torch.Tensor], Any],
                 criterion: Callable, fire: Callable[..., None], save_dir: Path) -> None:
        self.config = config
        self.ctx = ctx
        self.device = device
        self.amp_dtype = amp_dtype
        self.state = state
        self.forward = forward
        self.criterion = criterion
        self.fire = fire
        self.save_dir = save_dir
        self.first_step_done = False

    def __call__(self, imgs: torch.Tensor, targets: tuple[torch.Tensor, ...], epoch: int, batch: int,
                 step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One training iteration on a loader batch's images and the criterion's targets (on the device, as
        the task makes them from the batch: :meth:`yolotrain.task.Task.training_targets`), passed to it after
        the outputs. Returns the batch as the model saw it (device, layout, multi-scale size) and the detached
        loss."""
        memory_format = torch.channels_last if self.config.channels_last else torch.contiguous_format
        imgs = imgs.to(self.device, non_blocking=True, memory_format=memory_format)
        if self.config.data.multi_scale:
            imgs = self._multi_scale(imgs, epoch, batch)
        started = time.perf_counter()
        loss = self._backward_under_doctor(imgs, targets, epoch, batch, first=step == 0)
        if self.config.compile and not self.first_step_done and self.ctx.is_main:
            tqdm.write(f"torch.compile: the first step took {time.perf_counter() - started:.1f} s, "
                       "compilation included")
        self.first_step_done = True
        if step - self.state.last_opt_step >= self.state.accumulate:
            self._optimizer_step(epoch, batch)
            self.state.last_opt_step = step
        return imgs, loss

    @property
    def component_names(self) -> tuple[str, ...]:
        """The loss parts shown and written to results.csv: the criterion's, else (box, obj, cls)."""
        return tuple(getattr(self.criterion, "component_names", ("box", "obj", "cls")))

    def loss_components(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss parts for the progress bar; a custom loss without parts shows its total as the first."""
        parts = getattr(self.criterion, "components", None)
        count = len(self.component_names)
        if isinstance(parts, torch.Tensor) and parts.shape == (count,):
            return parts.to(self.device)
        return torch.cat((loss.float().view(1) / self.ctx.world_size, loss.new_zeros(count - 1)))

    def _multi_scale(self, imgs: torch.Tensor, epoch: int, batch: int) -> torch.Tensor:
        """The reference's ``--multi-scale``: the batch resized so its long side is a random multiple of the
        model's size multiple (a detector's largest stride) in 0.5-1.5x the image size; drawn from (seed, epoch,
        batch), the same on every process."""
        stride = int(self.state.model.size_multiple)
        size = self.config.data.img_size
        rng = np.random.default_rng([self.config.seed, epoch, batch])
        target = max(int(rng.integers(int(size * 0.5), int(size * 1.5) + stride)) // stride * stride, stride)
        factor = target / max(imgs.shape[2:])
        if factor == 1:
            return imgs
        shape = [math.ceil(side * factor / stride) * stride for side in imgs.shape[2:]]
        return F.interpolate(imgs, size=shape, mode="bilinear", align_corners=False)

    def _backward_under_doctor(self, imgs: torch.Tensor, targets: tuple[torch.Tensor, ...],
                               epoch: int, batch: int, first: bool) -> torch.Tensor:
        """Forward/backward; under the doctor for the first step with ``doctor`` (any failure it explains,
        in a custom loss say, is its report and one line), and rerun under it when backward fails because
        a saved tensor was modified in place."""
        try:
            if first and self.config.doctor and self.ctx.is_main:
                with watch():
                    return self._forward_backward(imgs, targets, epoch, batch)
            return self._forward_backward(imgs, targets, epoch, batch)
        except SavedTensorModifiedError:
            raise _doctor_failure(None) from None
        except DoctorError as error:  # a leaf or view write, a graph cut or freed: watch() only raised it
            print("\n\n".join(report.format() for report in error.reports), file=sys.stderr)
            raise _doctor_failure(error) from None
        except RuntimeError as error:
            if isinstance(error, TrainingError) or not is_inplace_error(error):
                raise
        self.state.optimizer.zero_grad(set_to_none=True)
        try:
            run_with_report(self._forward_backward, imgs, targets, epoch, batch)
        except SavedTensorModifiedError:
            pass
        raise _doctor_failure(None)

    def _forward_backward(self, imgs: torch.Tensor, targets: tuple[torch.Tensor, ...], epoch: int,
                          batch: int) -> torch.Tensor:
        """``targets``: the criterion's, after the outputs (a detection batch's ``[N, 6]`` rows, ...)."""
        try:
            with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32,
                                enabled=self.amp_dtype is not None):
                outputs = self.forward(imgs)
            loss = self.criterion(outputs, *targets, pred_size=imgs.shape[2:4])
            if self.ctx.enabled:
                loss = loss * self.ctx.world_size  # DDP averages gradients; the loss is a sum over images
            if self.config.data.quad:
                loss = loss * 4  # a quad batch has a quarter of the loaded images (the reference's factor)
            self.state.scaler.scale(loss).backward()
        except DivergenceError as error:
            raise TrainingError(self._divergence_message(epoch, batch, str(error))) from None
        return loss.detach()

    def _optimizer_step(self, epoch: int, batch: int) -> None:
        state = self.state
        state.scaler.unscale_(state.optimizer)
        grad_norm = nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=self.config.optim.max_grad_norm)
        # With loss scaling, an overflowed step is skipped by the scaler, not a divergence.
        if not state.scaler.is_enabled() and not bool(torch.isfinite(grad_norm)):
            raise TrainingError(self._divergence_message(epoch, batch, f"gradient norm is {grad_norm.item()}"))
        state.scaler.step(state.optimizer)
        state.scaler.update()
        self.fire("optimizer_step", epoch, batch)
        self.fire("on_before_zero_grad", epoch, batch)
        state.optimizer.zero_grad(set_to_none=True)
        if state.ema is not None:
            state.ema.update(state.model)

    def _divergence_message(self, epoch: int, batch: int, detail: str) -> str:
        lrs = ", ".join(f"{g['lr']:.3g}" for g in self.state.optimizer.param_groups)
        optim = self.config.optim
        kept = (f"; the last good checkpoint is {self.save_dir / 'weights' / 'last'}.safetensors"
                if (self.save_dir / "weights" / "last.json").exists() else "")
        return (f"training diverged at epoch {epoch + 1}, step {batch + 1} (learning rates {lrs}): {detail}. "
                f"Likely cause: learning rate too high for {optim.optimizer} (lr0={optim.lr0:g}); lower "
                f"--lr0 or lengthen warm-up{kept}")


def _doctor_failure(error: BaseException | None) -> TrainingError:
    """The one line that ends a step whose backward the doctor explained (its report printed above)."""
    what = ("a tensor saved for the gradient was modified in place" if error is None
            else str(error).splitlines()[0])
    return TrainingError(f"backward failed: {what} (the report above names the lines and the fix)")
