"""Building a batch's samples on threads of the process that trains, when it has no loader processes.

With ``workers`` 0 the DataLoader builds every batch in the training process, one sample after another, and
the other cores sit idle while JPEGs decode. OpenCV and numpy release the GIL for that work (decoding,
resizing, warping, colour tables), so a few threads spread it over the cores; each sample still comes from
its own seeded generator, so the batches are the same for any number of threads. Loader processes already
spread batches over the cores: inside them samples are built one at a time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from torch.utils.data import get_worker_info

Key = TypeVar("Key")
Sample = TypeVar("Sample")

# More threads than this gain little on a batch of 16 mosaics and hold memory (a scratch canvas each).
MAX_DEFAULT_THREADS = 8

_pools: dict[int, tuple[int, ThreadPoolExecutor]] = {}  # thread count -> (process that made it, pool)
_pools_lock = threading.Lock()


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_sample_threads(workers: int, world_size: int = 1) -> int:
    """Threads that build a batch's samples: none but the caller's with loader processes (``workers`` > 0); without,
    this process's share of the CPUs among ``world_size`` training processes, at most :data:`MAX_DEFAULT_THREADS`."""
    if workers:
        return 1
    return max(1, min(MAX_DEFAULT_THREADS, available_cpus() // max(world_size, 1)))


def map_samples(build: Callable[[Key], Sample], keys: Sequence[Key], threads: int) -> list[Sample]:
    """``[build(key) for key in keys]``, spread over ``threads`` threads in a process that is not a loader
    worker (an error is raised for the first failing key, as the loop would)."""
    if threads <= 1 or len(keys) <= 1 or get_worker_info() is not None:
        return [build(key) for key in keys]
    return list(_pool(threads).map(build, keys))


def _pool(threads: int) -> ThreadPoolExecutor:
    """The process's pool of ``threads`` threads, made on first use (again in a forked child, which inherits the
    parent's pool object but none of its threads)."""
    with _pools_lock:
        owner, pool = _pools.get(threads, (None, None))
        if owner != os.getpid() or pool is None:
            pool = ThreadPoolExecutor(threads, thread_name_prefix="yolotrain-samples")
            _pools[threads] = (os.getpid(), pool)
        return pool
