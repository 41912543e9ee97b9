"""The fast path: the tracker leaves the dispatch stack while nothing it would see can matter.

The dispatch mode's round trip into Python is the doctor's largest cost, so the tracker steps
aside (:meth:`Tracker.step_aside`) in two places:

* **backward** on CPU without ``create_graph``: backward then saves nothing, and a modified saved
  tensor is still caught by the unpack hook's version check. The engine captures the dispatch
  mode stack when backward starts, so the mode can only be left before entering it. A profile
  function puts the mode back while a Python frame of the program that the engine calls runs
  (a tensor or module hook, a custom ``backward``, an optimiser step from a post-accumulate-grad
  hook, checkpoint recomputation), so their writes are seen like forward writes.
* **an optimiser step while no saved tensor is alive** (after backward freed the graph): its
  in-place updates cannot touch a saved tensor, and the step saves nothing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .frames import is_user_code

if TYPE_CHECKING:
    from .mode import Tracker


def passes_closure(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> bool:
    """Whether ``optimizer.step`` was given a closure, which runs forward and backward inside it.

    Step hooks receive the bound call's arguments, so ``args`` starts with the optimizer itself.
    """
    positional = args[1:] if args and args[0] is optimizer else args
    return any(a is not None for a in positional) or any(v is not None for v in kwargs.values())


class FastPath:
    """Decides when ``tracker`` steps aside: during backward and after-backward optimiser steps."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.thread = 0  # the watching thread: steps of other threads leave the mode where it is
        self._step_hooks: list[Any] = []
        self._callback_frame: Any = None  # the user frame a backward pass called, while it runs

    def start(self) -> None:
        """Watch optimiser steps on this thread."""
        self.thread = threading.get_ident()
        self._step_hooks = [
            register_optimizer_step_pre_hook(self._before_step),
            register_optimizer_step_post_hook(self._after_step),
        ]

    def stop(self) -> None:
        for handle in self._step_hooks:
            handle.remove()
        self._step_hooks = []

    # -- backward ---------------------------------------------------------------------------

    def run_backward(self, engine_run: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Run autograd's engine, outside the tracker's mode where that cannot hide a write."""
        create_graph = args[3] if len(args) > 3 else kwargs.get("create_graph", False)
        if (
            create_graph
            # Nodes of other devices run on the engine's device threads, where only the mode (which the
            # engine carries over) sees what hooks write; a profiler already installed keeps its place.
            or not all(t.is_cpu for t in (args[0] if args else ()) if isinstance(t, torch.Tensor))
            or sys.getprofile() is not None
            or not self.tracker.step_aside("backward")
        ):
            return engine_run(*args, **kwargs)
        sys.setprofile(self._on_backward_python_event)
        try:
            return engine_run(*args, **kwargs)
        finally:
            sys.setprofile(None)
            self._end_callback()
            self.tracker.step_back()

    def _on_backward_python_event(self, frame: Any, event: str, arg: Any) -> None:
        """Profile function during backward: put the mode back while the user's code runs.

        The engine's own operators stay outside the mode; hooks, a custom ``backward``, an
        optimizer step from a post-accumulate-grad hook and checkpoint recomputation are
        Python frames the engine calls, and their writes are seen like forward writes.
        """
        if event == "call":
            if self._callback_frame is None and is_user_code(frame.f_code):
                self._callback_frame = frame
                self.tracker.join_for_callback()
        elif event == "return" and frame is self._callback_frame:
            self._end_callback()

    def _end_callback(self) -> None:
        """Leave the stack again when the user frame a backward pass called returns."""
        if self._callback_frame is not None:
            self._callback_frame = None
            self.tracker.leave_after_callback()

    # -- optimiser steps --------------------------------------------------------------------

    def _before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        """Optimizer step pre-hook: leave the stack when no saved tensor is alive to be written.

        After backward freed the graph, a step's in-place updates (half of a training step's
        operators with per-parameter AdamW) cannot touch a saved tensor, and the step saves
        nothing. With a live graph (a step between forward and backward, or a retained graph as
        in a GAN) or a closure (which runs forward inside the step) the mode stays.
        """
        if threading.get_ident() != self.thread:
            return
        tracker = self.tracker
        if tracker.aside == "step":
            tracker.step_back()  # a previous step raised, so its post-hook never ran
        if passes_closure(optimizer, args, kwargs) or tracker.live_saves() > 0:
            return
        tracker.step_aside("step")

    def _after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        """Optimizer step post-hook: back on the stack for the next forward pass."""
        self.back_from_step()

    def back_from_step(self) -> None:
        """Back on the stack after a step of the watching thread (or, when it raised, at the next save)."""
        if self.tracker.aside == "step" and threading.get_ident() == self.thread:
            self.tracker.step_back()
