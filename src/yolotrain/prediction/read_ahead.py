"""Reading (and predicting) the next still images while the current one is predicted.

A ``predict`` pass over image files alternates decoding a file (OpenCV, with the GIL released) and the model's
forward pass on it; a thread reading the next file while the current one runs overlaps the two. On a CPU with
several threads for PyTorch, a still image's forward pass at batch 1 leaves most of them waiting (its
convolutions are small: a yolo11n at 320 px runs 9.5 ms on 2 threads, 10.3 ms on one), so two images are read and
predicted side by side instead, each on its share of the threads (6.0 ms per image): see
:func:`forward_thread_shares`; a video file's frames likewise (:func:`in_order`). Results and their order are
those of reading in turn: only the moment each file is read and predicted changes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from queue import SimpleQueue
from typing import Generic, TypeVar

import torch

Key = TypeVar("Key", bound=Hashable)
Read = TypeVar("Read")
Item = TypeVar("Item")
Out = TypeVar("Out")


class ReadAhead(Generic[Key, Read]):
    """``read(key)`` for keys asked in turn, the next ones read on ``len(torch_threads)`` threads (one when not
    given) while the caller works on the one in hand; ``torch_threads`` gives each thread's PyTorch thread count.

    Use as a context manager: leaving it drops the reads not yet asked for.
    """

    def __init__(self, read: Callable[[Key], Read], torch_threads: Sequence[int] = ()) -> None:
        self._read = read
        self._pool = _threads(torch_threads)
        self._pending: dict[Key, Future[Read]] = {}

    def get(self, key: Key, following: Sequence[Key] = ()) -> Read:
        """What ``read(key)`` gives (read ahead if an earlier call named it among ``following``; its error, if it
        failed, raised here), after starting to read each of ``following`` not yet started. Every read runs on the
        threads, so each forward pass they make runs on its share of PyTorch's threads."""
        for wanted in (key, *following):
            if wanted not in self._pending:
                self._pending[wanted] = self._pool.submit(self._read, wanted)
        return self._pending.pop(key).result()

    def close(self) -> None:
        for pending in self._pending.values():
            pending.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> ReadAhead[Key, Read]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def in_order(work: Callable[[Item], Out], items: Iterable[Item], torch_threads: Sequence[int]) -> Iterator[
        tuple[Item, Out]]:
    """``(item, work(item))`` for each of ``items`` in turn, worked on ``len(torch_threads)`` at a time on threads
    with those PyTorch thread counts while the caller takes the next item (a video's next frame) and handles the
    results given. Leaving early drops the work not yet started."""
    pool = _threads(torch_threads)
    pending: deque[tuple[Item, Future[Out]]] = deque()
    try:
        for item in items:
            pending.append((item, pool.submit(work, item)))
            if len(pending) > len(torch_threads):
                done, result = pending.popleft()
                yield done, result.result()
        while pending:
            done, result = pending.popleft()
            yield done, result.result()
    finally:
        for _, result in pending:
            result.cancel()
        pool.shutdown(wait=False)


def _threads(torch_threads: Sequence[int]) -> ThreadPoolExecutor:
    """``len(torch_threads)`` threads (one when empty), each running PyTorch on its count of threads."""
    shares: SimpleQueue[int] = SimpleQueue()
    for share in torch_threads:
        shares.put(share)
    # Each thread takes its share once, as it starts (PyTorch's thread count is the calling thread's own).
    return ThreadPoolExecutor(max(len(torch_threads), 1), thread_name_prefix="yolotrain-read-ahead",
                              initializer=(lambda: torch.set_num_threads(shares.get())) if torch_threads else None)


def forward_thread_shares(threads: int, images: int, side_by_side: bool) -> list[int]:
    """PyTorch's thread count for each of the forward passes that run side by side over ``images`` still images,
    sharing the caller's ``threads``: two passes (measured on 2 cores, where a third has no core of its own)
    when ``side_by_side`` (a PyTorch model on the CPU, nothing hooked into its layers), there are two threads or
    more and two images or more; else none: one image at a time on the caller's thread."""
    if not side_by_side or threads < 2 or images < 2:
        return []
    return [threads - threads // 2, threads // 2]
