"""Threads started under :func:`watch`: each runs a write-only dispatch mode for its lifetime.

Saved tensors are recorded on the watching thread only. ``threading.setprofile`` makes every
thread started while the tracker is active enter a :class:`ThreadWrites` mode at its start;
there, writes into the memory of saved tensors are matched and kept with the thread's name. A
write is settled (its version bump checked) at that thread's next operator, or by the tracker
when it reports (the thread's operator has returned by then). After the watch is over such a
thread passes operators straight through.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

from torch.utils._python_dispatch import TorchDispatchMode

from .messages import PROBE_THREAD_PREFIX
from .records import OPS, PendingWrite, op_info

if TYPE_CHECKING:
    from .mode import Tracker

# Thread modes kept before those of finished threads with nothing left to settle are dropped.
MAX_KEPT_THREADS = 64


class ThreadWrites(TorchDispatchMode):
    """The dispatch mode of a thread started under :func:`watch`: it only looks for writes."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # as for Tracker: compiled code stays compiled

    def __init__(self, tracker: Tracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.thread = threading.current_thread()
        self.unsettled: list[PendingWrite] = []
        self.lock = threading.Lock()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch protocol
        info = OPS.get(func) or op_info(func)
        tracker = self.tracker
        if self.unsettled:
            self.settle()
        if info.writes is None or tracker.closed:
            return info.call(*args, **kwargs) if kwargs else info.call(*args)
        return tracker.run_writing(info, args, kwargs or {}, self)

    def settle(self) -> None:
        """Settle the writes this thread made (called on it, or by the tracker when reporting)."""
        with self.lock:
            pending, self.unsettled = self.unsettled, []
        self.tracker.found.settle(pending)


class ThreadWatch:
    """Gives every thread started while the tracker is active its :class:`ThreadWrites` mode."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        # Held strongly: a finished thread's last write is settled only when the tracker reports.
        self._modes: list[ThreadWrites] = []
        self._previous_profile: Any = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Install the ``threading.setprofile`` hook, keeping the one it replaces for the threads."""
        self._previous_profile = threading.getprofile()
        threading.setprofile(self._on_thread_start)

    def stop(self) -> None:
        """Threads started from now on get no mode (and the replaced hook again)."""
        threading.setprofile(self._previous_profile)

    def _on_thread_start(self, frame: Any, event: str, arg: Any) -> None:
        """``threading.setprofile`` hook: runs once at the start of every thread started while watching."""
        sys.setprofile(self._previous_profile)
        thread = threading.current_thread()
        if self.tracker.closed or thread.name.startswith(PROBE_THREAD_PREFIX):
            return
        writes = ThreadWrites(self.tracker)
        with self._lock:
            if len(self._modes) >= MAX_KEPT_THREADS:
                self._modes = [w for w in self._modes if w.unsettled or w.thread.is_alive()]
            self._modes.append(writes)
        writes.__enter__()  # for the thread's lifetime; a no-op pass-through once the watch is over

    def settle(self) -> None:
        """Settle the writes of every thread (their operators have returned by the time this runs)."""
        with self._lock:
            modes = list(self._modes)
        for writes in modes:
            if writes.unsettled:
                writes.settle()
