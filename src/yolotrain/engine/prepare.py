"""What a trainer's setup prepares besides data and model: the seeds, the precision (autocast dtype,
gradient scaler, cuDNN autotuning) and the frozen layers."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..devices import native_bf16, native_half
from ..model import Yolov5
from ..settings import ConfigError


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def autocast_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of an ``amp`` setting on ``device`` (``None``: full float32).

    ``auto`` is float16 on CUDA (as the reference) and bfloat16 on CPUs with native bf16 instructions:
    the study in ``benchmarks/results/bf16_study.md`` found bf16 training's mAP50-95 within the seed
    spread of float32's there, at about twice the step speed."""
    if amp == "auto":
        return native_half(device)
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError("amp fp16 needs a CUDA device; on the CPU use amp bf16")
    return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]


def precision_line(amp: str, amp_dtype: torch.dtype | None, device: torch.device) -> str:
    """The run's first line: the precision it trains in, and why (``--amp auto`` decides by the device)."""
    if amp_dtype is None:
        why = ("--amp auto: this CPU has no native bfloat16 instructions" if amp == "auto" and device.type == "cpu"
               else f"--amp {amp}")
        return f"Precision: float32 on {device.type} ({why})"
    name = str(amp_dtype).removeprefix("torch.")
    if device.type == "cpu" and amp_dtype == torch.bfloat16:
        native = native_bf16()
        why = (f"--amp {amp}: native on this CPU ({native}); --amp off for float32" if native else
               f"--amp {amp}: this CPU has no native bfloat16, so expect it to be slower than float32")
    else:
        why = f"--amp {amp}"
    return f"Precision: {name} mixed precision on {device.type} ({why})"


def grad_scaler(device: torch.device, amp_dtype: torch.dtype | None) -> torch.amp.GradScaler:
    """cuDNN autotuning; the gradient scaler."""
    if device.type == "cuda":
        # Training batches keep a few shapes (square, or the rect/multi-scale sizes), so timing the
        # cuDNN algorithms once per shape pays back within the first epoch (the reference does too).
        torch.backends.cudnn.benchmark = True
    # Only float16 needs loss scaling: bfloat16 has float32's exponent range, so gradients do not underflow.
    return torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)


def freeze_layers(model: Yolov5, layers: Sequence[int], log: Callable[[str], None] | None) -> None:
    """The reference's ``--freeze``: one N freezes layers 0..N-1, several numbers those layers. Frozen
    parameters get no gradient, so the optimiser leaves them exactly as they are."""
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
    if log is not None:
        log(f"Freezing layers {', '.join(str(i) for i in indices)}: {len(frozen)} parameter tensors "
            f"({sum(p.numel() for p in frozen):,} values)")
