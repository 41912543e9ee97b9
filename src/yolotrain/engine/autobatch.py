"""AutoBatch: the largest training batch that fits a fraction of the GPU's memory, found as the
reference's ``utils/autobatch.py`` finds it (memory after forward + backward at batches 1-16, a
straight line through it, solved for the free memory times the fraction, truncated to an integer)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

GIB = 1 << 30
PROBE_BATCHES = (1, 2, 4, 8, 16)
# The reference's fraction for --batch-size -1, and the batch it falls back to.
DEFAULT_FRACTION = 0.8
SAFE_RANGE = (1, 1024)


def fit_batch_size(batch_sizes: Sequence[int], memory_gib: Sequence[float | None], free_gib: float, fraction: float,
                   fallback: int) -> int:
    """The batch whose fitted memory use is ``fraction`` of ``free_gib``.

    ``memory_gib[i]`` is the memory taken at ``batch_sizes[i]`` (``None``: it did not fit). Below a
    failed size the batch is the last size that fitted; outside 1-1024, or with fewer than two
    measurements, it is ``fallback``.
    """
    measured = [(b, m) for b, m in zip(batch_sizes, memory_gib) if m is not None]
    if len(measured) < 2:
        return fallback
    slope, intercept = np.polyfit([b for b, _ in measured], [m for _, m in measured], deg=1)
    if slope <= 0:
        return fallback
    batch = int((free_gib * fraction - intercept) / slope)
    if None in memory_gib:
        failed = list(memory_gib).index(None)
        if batch >= batch_sizes[failed]:
            batch = batch_sizes[max(failed - 1, 0)]
    return batch if SAFE_RANGE[0] <= batch <= SAFE_RANGE[1] else fallback


def output_tensors(outputs: torch.Tensor | Sequence) -> list[torch.Tensor]:
    """The tensors of a training forward's outputs, nested lists and tuples flattened in order (a detector's
    maps; a segmentation model's maps, then its prototypes)."""
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    return [tensor for output in outputs for tensor in output_tensors(output)]


def train_pass(model: nn.Module, batch: int, img_size: int, device: torch.device, dtype: torch.dtype | None) -> None:
    """One forward and backward of ``model`` (in training mode) on a batch of square images, as a training step
    holds memory: every output of any task's head takes part in the backward, under autocast when ``dtype``."""
    images = torch.empty(batch, 3, img_size, img_size, device=device)
    with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        outputs = model(images)
    sum(o.float().sum() for o in output_tensors(outputs)).backward()
    model.zero_grad(set_to_none=True)


def measure_memory(model: nn.Module, img_size: int, device: torch.device, dtype: torch.dtype | None,
                   batch_sizes: Sequence[int] = PROBE_BATCHES, repeats: int = 3) -> list[float | None]:
    """GiB reserved on ``device`` after ``repeats`` forward + backward passes of a copy of ``model`` at
    each batch size (``None`` where it ran out of memory), under autocast to ``dtype`` when given."""
    probe = copy.deepcopy(model).to(device).train()
    memory: list[float | None] = []
    for batch in batch_sizes:
        try:
            for _ in range(repeats):
                train_pass(probe, batch, img_size, device, dtype)
            memory.append(torch.cuda.memory_reserved(device) / GIB)
        except torch.cuda.OutOfMemoryError:
            memory.append(None)
        torch.cuda.empty_cache()
    return memory


def autobatch(model: nn.Module, img_size: int, device: torch.device, fraction: float, fallback: int,
              dtype: torch.dtype | None, log: Callable[[str], None], processes: int = 1) -> int:
    """The batch for ``fraction`` of ``device``'s free memory; ``fallback``, said in one line, off CUDA or
    with several processes (each would measure its own GPU; the reference too probes only alone)."""
    if device.type != "cuda" or processes > 1:
        why = f"needs CUDA (this run is on {device.type})" if device.type != "cuda" else \
            f"probes one process alone (this run has {processes})"
        log(f"AutoBatch {why}: using batch {fallback}")
        return fallback
    properties = torch.cuda.get_device_properties(device)
    total = properties.total_memory / GIB
    free = total - (torch.cuda.memory_reserved(device) + torch.cuda.memory_allocated(device)) / GIB
    memory = measure_memory(model, img_size, device, dtype)
    batch = fit_batch_size(PROBE_BATCHES, memory, free, fraction, fallback)
    log(f"AutoBatch: batch {batch} for {fraction:.0%} of {properties.name}'s {free:.1f} GiB free "
        f"(of {total:.1f} GiB; measured at batches {', '.join(map(str, PROBE_BATCHES))})")
    return batch
