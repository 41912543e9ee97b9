"""What a trainer's setup prepares besides data and model: the seeds, the precision (autocast dtype,
gradient scaler, cuDNN autotuning) and the frozen layers."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..model import Yolov5
from ..settings import ConfigError


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def autocast_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of an ``amp`` setting on ``device`` (``None``: full float32)."""
    if amp == "auto":
        return torch.float16 if device.type == "cuda" else None
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError("amp fp16 needs a CUDA device; on the CPU use amp bf16")
    return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]


def grad_scaler(device: torch.device, amp_dtype: torch.dtype | None,
                log: Callable[[str], None] | None) -> torch.amp.GradScaler:
    """cuDNN autotuning, the mixed-precision notice (``log``, on rank 0); the gradient scaler."""
    if device.type == "cuda":
        # Training batches keep a few shapes (square, or the rect/multi-scale sizes), so timing the
        # cuDNN algorithms once per shape pays back within the first epoch (the reference does too).
        torch.backends.cudnn.benchmark = True
    if amp_dtype is not None and log is not None:
        slow = (device.type == "cpu" and amp_dtype == torch.bfloat16
                and not torch.ops.mkldnn._is_mkldnn_bf16_supported())
        log(f"Mixed precision: {str(amp_dtype).removeprefix('torch.')} autocast on {device.type}"
            + ("; this CPU has no native bfloat16, so expect it to be slower than float32" if slow else ""))
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
