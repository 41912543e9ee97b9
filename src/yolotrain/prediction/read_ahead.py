"""Reading the next still image while the current one is predicted.

A ``predict`` pass over image files alternates decoding a file (OpenCV, with the GIL released) and the model's
forward pass on it; a thread reading the next file while the current one runs overlaps the two. Results and
their order are those of reading in turn: only the moment each file is read changes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Read = TypeVar("Read")


class ReadAhead(Generic[Key, Read]):
    """``read(key)`` for keys asked in turn, each next one read on a thread while the caller works on the one in hand.

    Use as a context manager: leaving it drops a read not yet asked for.
    """

    def __init__(self, read: Callable[[Key], Read]) -> None:
        self._read = read
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="yolotrain-read-ahead")
        self._pending: dict[Key, Future[Read]] = {}

    def get(self, key: Key, following: Key | None = None) -> Read:
        """What ``read(key)`` gives (read ahead if an earlier call named it ``following``; its error, if it failed,
        raised here), after starting to read ``following`` on the thread."""
        pending = self._pending.pop(key, None)
        if following is not None and following not in self._pending:
            self._pending[following] = self._pool.submit(self._read, following)
        return pending.result() if pending is not None else self._read(key)

    def close(self) -> None:
        for pending in self._pending.values():
            pending.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> ReadAhead[Key, Read]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
