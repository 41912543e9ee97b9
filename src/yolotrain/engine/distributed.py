"""Multi-process training on torch.distributed (launched with ``torchrun``)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

# How long the processes of a (re)started group wait for each other to join before giving up with one line.
JOIN_TIMEOUT = timedelta(minutes=5)
# Collectives may wait while rank 0 validates and saves an epoch; the reference allows them three hours.
COLLECTIVE_TIMEOUT = timedelta(hours=3)
# Written by rank 0 into a run folder started under an elastic agent: restarted workers find the run by it.
ELASTIC_MARKER = "elastic.json"


class DistributedError(RuntimeError):
    """The process group could not be formed; the message says which process waited for what."""


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands: passed explicitly, never read from globals by the training code."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    # Set when launched by torchrun's elastic agent: its job id and how often it has restarted the group.
    elastic_run_id: str | None = None
    restart_count: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def context_from_env() -> DistributedContext:
    """Read torchrun's RANK / LOCAL_RANK / WORLD_SIZE (a single process when they are absent)."""
    return DistributedContext(rank=int(os.environ.get("RANK", 0)), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                              world_size=int(os.environ.get("WORLD_SIZE", 1)),
                              elastic_run_id=os.environ.get("TORCHELASTIC_RUN_ID"),
                              restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))


def init_process_group(ctx: DistributedContext, device: torch.device) -> None:
    """gloo on CPU, nccl on CUDA; each process drives the GPU matching its local rank.

    Raises:
        DistributedError: not every process joined within :data:`JOIN_TIMEOUT`.
    """
    if not ctx.enabled or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        dist.init_process_group(backend, store=_round_store(ctx), rank=ctx.rank, world_size=ctx.world_size,
                                timeout=COLLECTIVE_TIMEOUT, device_id=device if device.type == "cuda" else None)
    except (RuntimeError, ValueError) as error:  # DistStoreError and DistNetworkError are RuntimeErrors
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DistributedError(f"process {ctx.rank} of {ctx.world_size} could not join the process group: {reason} "
                               f"(processes wait {JOIN_TIMEOUT.total_seconds():.0f} s for each other)") from None


def _round_store(ctx: DistributedContext) -> dist.Store:
    """The key-value store the group forms through, with keys of this launch round alone.

    torchrun's agent keeps one store (at MASTER_ADDR:MASTER_PORT) for every round of a job. After it
    restarts a failed group, the new workers would read the old round's keys (the dead rank 0's
    address, the old barrier counts) and connect to a dead process or wait forever; prefixing the
    keys with the agent's restart count gives each round its own. (Agents on several machines may
    count restarts differently; with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` they start a fresh store,
    hosted by rank 0, for each round, and no prefix is needed.)
    """
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", 29500))
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(host, port, ctx.world_size, is_master=ctx.rank == 0 and not agent_hosts_store,
                          timeout=JOIN_TIMEOUT, multi_tenant=True)
    return dist.PrefixStore(f"yolotrain/round{ctx.restart_count if agent_hosts_store else 0}", store)


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx: DistributedContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.barrier()


def mark_elastic_run(ctx: DistributedContext, run_dir: Path) -> None:
    """Rank 0 of a job launched by an elastic agent tags its run folder with the job id."""
    if ctx.elastic_run_id is not None and ctx.is_main:
        (run_dir / ELASTIC_MARKER).write_text(json.dumps({"run_id": ctx.elastic_run_id}))


def elastic_run_dir(ctx: DistributedContext, project: str | os.PathLike) -> Path | None:
    """The run folder an earlier round of this elastic job started (``None``: none has).

    All processes find the same folder (the project folder is shared between machines). The restart
    count does not decide: agents on several machines count restarts differently, and a process of the
    first round that finds the folder rank 0 just made continues nothing, as no checkpoint is in it yet.
    """
    if ctx.elastic_run_id is None:
        return None
    found = []
    for marker in Path(project).glob(f"*/{ELASTIC_MARKER}"):
        try:
            if json.loads(marker.read_text()).get("run_id") == ctx.elastic_run_id:
                found.append((marker.stat().st_mtime, marker.parent))
        except (OSError, ValueError):
            continue  # a marker being written, or of no run of ours
    return max(found)[1] if found else None  # a job id used again: its newest run


def record_error_for_agent(message: str) -> None:
    """Under torchrun's elastic agent, ``message`` (the one line the worker printed) as this worker's error
    file, in the layout torch's ``@record`` writes: the agent's failure summary then shows the line as the
    worker's ``traceback`` instead of "To enable traceback see: https://pytorch.org/docs/...". The agent's
    own traceback, printed as it re-raises ``ChildFailedError``, cannot be avoided from a worker."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": message,
                        "extraInfo": {"py_callstack": message, "timestamp": str(int(time.time()))}}}
    try:
        Path(path).write_text(json.dumps(data))
    except OSError:
        pass  # the agent's summary then says less; the line itself is printed already


def launch_command(processes: int, argv: Sequence[str]) -> list[str]:
    """``yolotrain ARGV`` in ``processes`` processes on this machine, started by torchrun's agent (the
    engine ``torchrun --standalone --nproc_per_node N`` is), which sets each one's rank."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            "-m", "yolotrain", *argv]
