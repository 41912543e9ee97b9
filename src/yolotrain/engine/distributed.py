"""Multi-process training on torch.distributed (launched with ``torchrun``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands: passed explicitly, never read from globals by the training code."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def context_from_env() -> DistributedContext:
    """Read torchrun's RANK / LOCAL_RANK / WORLD_SIZE (a single process when they are absent)."""
    return DistributedContext(rank=int(os.environ.get("RANK", 0)), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                              world_size=int(os.environ.get("WORLD_SIZE", 1)))


def init_process_group(ctx: DistributedContext, device: torch.device) -> None:
    """gloo on CPU, nccl on CUDA; each process drives the GPU matching its local rank."""
    if not ctx.enabled or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=ctx.rank, world_size=ctx.world_size, device_id=device)
    else:
        dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.world_size)


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx: DistributedContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.barrier()

