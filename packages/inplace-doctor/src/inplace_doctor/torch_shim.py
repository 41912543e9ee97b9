"""Every private PyTorch API the doctor uses, in one place, each with its fallback.

The doctor stays correct where one of these is missing; it only gets slower (the dispatch
mode then also sees backward) or reports less (no storage for sparse tensors).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.utils import _python_dispatch

T = TypeVar("T")

# PyTorch has no public accessor for the innermost dispatch mode. Without it the tracker never
# steps aside for backward, which keeps it correct and only makes it slower.
innermost_mode: Callable[[], Any] | None = getattr(_python_dispatch, "_get_current_dispatch_mode", None)

current_autograd_node: Callable[[], Any] = torch._C._current_autograd_node
overlaps: Callable[[torch.Tensor, torch.Tensor], bool] = torch._C._overlaps
disable_torch_dispatch = torch._C._DisableTorchDispatch


def storage_key(tensor: torch.Tensor) -> int | None:
    """Identity of the memory a tensor lives in; views and ``.data`` aliases share it."""
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, TypeError):
        # Sparse tensors and wrapper subclasses without real memory have no single storage; in-place
        # writes to them cannot alias a saved dense tensor, so they are not tracked.
        return None


def restore_foreach_bumps(written: list[torch.Tensor], before: list[int]) -> None:
    """Give ``_foreach_*_`` ops on CPU the version bumps they get outside a dispatch mode.

    On CPU these ops loop over per-tensor in-place kernels, and those inner calls bump the
    version counters; under a dispatch mode the inner calls skip that step, so the error a
    program hits without the doctor would silently disappear. Restoring the bumps keeps
    behaviour identical. Other devices use fused kernels that behave the same either way.
    """
    if not written or not all(t.is_cpu for t in written):
        return
    if all(t._version == v for t, v in zip(written, before)):
        torch._C._increment_version(written)


# -- the entry into the autograd engine -------------------------------------------------------

BackwardHandler = Callable[[Callable[..., Any], tuple, dict], Any]

_engine_lock = threading.Lock()
_engine_users = 0
_engine_original: Callable[..., Any] | None = None


def _wrap_engine_run(engine_run: Callable[..., T], handler: BackwardHandler) -> Callable[..., T]:
    @functools.wraps(engine_run)
    def run(*args: Any, **kwargs: Any) -> T:
        return handler(engine_run, args, kwargs)

    run.__wrapped_by_doctor__ = True  # type: ignore[attr-defined]
    return run


def acquire_backward_entry(handler: BackwardHandler) -> bool:
    """Route ``backward()`` and ``autograd.grad()`` through ``handler(engine_run, args, kwargs)``.

    ``torch.autograd.graph._engine_run_backward`` is private, so every lookup is guarded: where
    it is missing (or ``torch.autograd`` holds a different function under that name) nothing is
    wrapped and False is returned. ``torch.autograd`` binds its own name for it at import, so both
    modules are patched, as PyTorch itself does for non-strict tracing. Calls are counted; the
    original comes back with the last :func:`release_backward_entry`.
    """
    global _engine_users, _engine_original
    with _engine_lock:
        if _engine_users == 0:
            graph = torch.autograd.graph
            original = getattr(graph, "_engine_run_backward", None)
            if (
                original is None
                or getattr(original, "__wrapped_by_doctor__", False)
                or innermost_mode is None
                or getattr(torch.autograd, "_engine_run_backward", None) is not original
            ):
                return False
            wrapped = _wrap_engine_run(original, handler)
            graph._engine_run_backward = wrapped  # type: ignore[attr-defined]
            torch.autograd._engine_run_backward = wrapped  # type: ignore[attr-defined]
            _engine_original = original
        _engine_users += 1
        return True


def release_backward_entry() -> None:
    """Undo one :func:`acquire_backward_entry`; the last one puts PyTorch's function back."""
    global _engine_users, _engine_original
    with _engine_lock:
        if _engine_users == 0:
            return
        _engine_users -= 1
        if _engine_users == 0 and _engine_original is not None:
            torch.autograd.graph._engine_run_backward = _engine_original  # type: ignore[attr-defined]
            torch.autograd._engine_run_backward = _engine_original  # type: ignore[attr-defined]
            _engine_original = None


def backward_entry_wrapped() -> bool:
    """Whether the engine entry currently goes through the doctor (for tests and diagnostics)."""
    return getattr(getattr(torch.autograd.graph, "_engine_run_backward", None), "__wrapped_by_doctor__", False)



def next_sequence_nr(roots: tuple[Any, ...]) -> int:
    """The number the next autograd node made on this thread gets (nodes are numbered in creation order).

    ``torch._C._autograd._get_sequence_nr`` is private; without it, one more than the newest root's.
    """
    getter = getattr(torch._C._autograd, "_get_sequence_nr", None)
    if getter is not None:
        return int(getter())
    return 1 + max(node._sequence_nr() for node in roots)
