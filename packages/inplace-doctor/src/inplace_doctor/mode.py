"""The tracker: the dispatch mode and saved-tensor hooks that watch saved tensors and the writes to them.

Two PyTorch hooks do the work:

* ``saved_tensors_hooks``: every tensor autograd saves passes through :meth:`Tracker._pack`,
  which records its version and the user's source line, indexed by storage so that
  writes can be matched to it. Installing these hooks turns off PyTorch's own version
  check for those tensors, so :meth:`Tracker._unpack` performs the identical check and
  raises the identical ``RuntimeError`` message, now carrying a :class:`Report`.
* a ``TorchDispatchMode``: every aten operator passes through it; those whose schema
  writes an argument (in-place, ``out=``, ``_foreach_*_``, fused optimiser kernels) are
  matched against the saved tensors sharing their storage.

Only the in-place path does real work; the per-operator cost otherwise is a dict lookup,
a frame read and two attribute stores. The tracker's helpers each do one job:
:mod:`.fast_path` decides when the mode leaves the dispatch stack (backward, and optimiser
steps after it), :mod:`.threads` watches threads started meanwhile, and :mod:`.reporting`
keeps the findings and builds the reports.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .fast_path import FastPath
from .frames import call_context, user_site
from .graph_cut import explain_cut, is_graph_cut_error
from .graph_freed import BackwardHistory, is_graph_freed_error, mark_carried_inputs
from .messages import DoctorError
from .records import (
    OPS,
    Finding,
    OpInfo,
    PendingWrite,
    SavedRecord,
    SaveInfo,
    is_output,
    op_info,
    output_ids,
    written_tensors,
)
from .report import Report
from .reporting import Findings, finding_report, version_error, warning_reports
from .silent_cut import SilentCuts
from .threads import ThreadWatch, ThreadWrites
from .torch_shim import (
    acquire_backward_entry,
    current_autograd_node,
    disable_torch_dispatch,
    innermost_mode,
    release_backward_entry,
    restore_foreach_bumps,
    storage_key,
)

# Distinct findings kept per tracker; further ones only count (a loop repeating one bug is one finding).
MAX_FINDINGS = 256
_JIT_GRAPH_NODE = "DifferentiableGraphBackward"


def _backward_through_tracker(engine_run: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Every backward pass while a tracker is innermost (installed around ``_engine_run_backward``).

    The tracker remembers the pass for a later "backward through the graph a second time",
    explains a backward on a loss without graph, and runs the engine on its fast path.
    """
    mode = innermost_mode() if innermost_mode is not None else None
    if not isinstance(mode, Tracker):
        return engine_run(*args, **kwargs)
    call = mode.backwards.start(args, kwargs)
    try:
        result = mode.fast_path.run_backward(engine_run, args, kwargs)
    except RuntimeError as error:
        explained = explain_cut(error, mode.cwd) if is_graph_cut_error(error) else None
        if explained is not None and explained.reports:
            raise explained.with_traceback(error.__traceback__) from None
        if not is_graph_freed_error(error) or isinstance(error, DoctorError):
            raise
        raise mode.backwards.explain(error, call).with_traceback(error.__traceback__) from None
    mode.backward_passes += 1
    return result


class Tracker(TorchDispatchMode):
    """Records saved tensors and the in-place operators that touch them; see :func:`watch`."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # The default wraps __torch_dispatch__ in a dynamo-disabling shim that costs ~2 us per op.
        return False

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Let torch.compile compile as it does without the doctor (instead of falling back to
        # eager), so the program and PyTorch's error stay the same; the mode sees the operators
        # the compiled code runs.
        return True

    def __init__(self, cwd: str) -> None:
        super().__init__()
        self.cwd = cwd
        self._index: dict[int, list[weakref.ref[SavedRecord]]] = {}
        self._pending: list[SavedRecord] = []
        self._unsettled: list[PendingWrite] = []
        self._last: tuple[OpInfo, int | tuple[int, ...], tuple[int, int]] | None = None
        self._consumed: tuple[object, list[int]] = (None, [])
        self._since_sweep = 0
        self._sweep_at = 4096
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._aside: str | None = None  # "backward" or "step" while the mode is off the stack
        self._engine_wrapped = False
        self.closed = False
        self.found = Findings(MAX_FINDINGS)
        self.fast_path = FastPath(self)
        self.threads = ThreadWatch(self)
        self.backwards = BackwardHistory(cwd)  # for "backward through the graph a second time"
        self.backward_passes = 0  # completed ones: the steps a verified fix is said to have run
        self.silent_cuts: SilentCuts | None = None  # set by the watch() that owns the tracker

    @property
    def findings(self) -> list[Finding]:
        """The distinct saved tensors found modified so far, in the order found."""
        return self.found.items

    @property
    def dropped_findings(self) -> int:
        """Distinct findings beyond :data:`MAX_FINDINGS`, counted only."""
        return self.found.dropped

    # -- activation -------------------------------------------------------------------------

    def __enter__(self) -> Tracker:
        self._engine_wrapped = acquire_backward_entry(_backward_through_tracker)
        self._hooks.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._hooks.__exit__(None, None, None)
            self._release_engine()
            raise
        self.fast_path.start()
        self.threads.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True
        self.threads.stop()
        self.fast_path.stop()
        try:
            if self._aside is None:
                super().__exit__(*exc)
        finally:
            self._aside = None
            self._hooks.__exit__(*exc)
            self._release_engine()
            self.settle()
            # Saves still waiting for "the next operator" will not see one; drop the references.
            self._forget_neighbours()

    def _release_engine(self) -> None:
        if self._engine_wrapped:
            self._engine_wrapped = False
            release_backward_entry()

    # -- on and off the dispatch stack (when: see fast_path) --------------------------------

    @property
    def aside(self) -> str | None:
        """Why the mode is off the dispatch stack ("backward" or "step"); None while it is on."""
        return self._aside

    def step_aside(self, reason: str) -> bool:
        """Take the mode off the dispatch stack; False (and nothing done) unless it is innermost."""
        if self._aside is not None or innermost_mode is None or innermost_mode() is not self:
            return False
        self._leave_stack()
        self._aside = reason
        return True

    def step_back(self) -> None:
        """Put the mode back on the dispatch stack after :meth:`step_aside`."""
        if self._aside is None:
            return
        self._aside = None
        self._forget_neighbours()
        TorchDispatchMode.__enter__(self)

    def join_for_callback(self) -> None:
        """Back on the stack while Python code that a backward pass called runs (still aside for backward)."""
        TorchDispatchMode.__enter__(self)

    def leave_after_callback(self) -> None:
        """Off the stack again when that code returns."""
        self._leave_stack()

    def _leave_stack(self) -> None:
        self.settle()
        TorchDispatchMode.__exit__(self, None, None, None)
        self._forget_neighbours()

    def _forget_neighbours(self) -> None:
        """Cut the links between saves and the operators around them.

        Operators the mode did not see ran in between, so "the operator before/after a save"
        would name the wrong one; those saves keep only their own evidence.
        """
        self._pending = []
        self._last = None

    # -- dispatch: every aten operator ------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch protocol
        info = OPS.get(func) or op_info(func)
        frame = sys._getframe(1)
        key = (id(frame), frame.f_lasti)
        if self._unsettled:
            self._settle_writes()
        if self._pending:
            self._resolve_pending(info.name, key)
        if self.backwards.boundary:
            mark_carried_inputs(args, self.backwards.boundary)
        if info.writes is None:
            out = info.call(*args, **kwargs) if kwargs else info.call(*args)
        else:
            out = self.run_writing(info, args, kwargs or {})
        self._last = (info, output_ids(out), key)
        return out

    def run_writing(self, info: OpInfo, args: tuple, kwargs: dict, thread: ThreadWrites | None = None) -> Any:
        """Run an in-place/out= operator, noting every saved tensor in memory it writes."""
        hits: list[tuple[SavedRecord, torch.Tensor, int]] = []
        written = list(written_tensors(info, args, kwargs))
        before = [t._version for t in written] if info.foreach else None
        for tensor in written:
            storage = storage_key(tensor)
            refs = self._index.get(storage) if storage is not None else None
            if refs:
                for ref in refs:
                    rec = ref()
                    if rec is not None:
                        hits.append((rec, tensor, rec.tensor._version))
        out = info.call(*args, **kwargs)
        if before is not None:
            restore_foreach_bumps(written, before)
        if hits:
            context = call_context(0)
            name = threading.current_thread().name
            in_backward = thread is None and self._aside == "backward"
            writes = [PendingWrite(rec, t, before, info.name, context, name, in_backward) for rec, t, before in hits]
            if thread is None:
                self._unsettled.extend(writes)
            else:
                with thread.lock:
                    thread.unsettled.extend(writes)
        return out

    def _resolve_pending(self, op: str, key: tuple[int, int]) -> None:
        """Saves made since the last operator learn which operator ran next."""
        pending, self._pending = self._pending, []
        for rec in pending:
            info = rec.info
            info.next_op = op
            info.next_match = info.key == key
            if info.next_match and not info.output_save and rec.orig_ref is not None:
                # An input of the op being dispatched: holding it creates no reference cycle,
                # and PyTorch's message names its *current* grad_fn, so keep the original.
                original = rec.orig_ref()
                if original is not None:
                    rec.tensor = original
                    rec.orig_ref = None

    def _settle_writes(self) -> None:
        """Decide, now that version counters were bumped, which matched writes changed a saved tensor."""
        writes, self._unsettled = self._unsettled, []
        self.found.settle(writes)

    def settle(self) -> None:
        """Process writes still waiting for their version bump (call before reading findings)."""
        if self._unsettled:
            self._settle_writes()

    def settle_all(self) -> None:
        """:meth:`settle`, and other threads' writes too (their operators have returned by now)."""
        self.settle()
        self.threads.settle()

    # -- saved tensor hooks -----------------------------------------------------------------

    def _pack(self, tensor: torch.Tensor) -> SavedRecord:
        """Autograd saves ``tensor``: remember its version, site and memory; store a record."""
        if self._aside == "step":
            # The step raised after leaving the stack; a new graph is being built, so rejoin now.
            self.fast_path.back_from_step()
        if self._unsettled:
            self._settle_writes()
        frame = sys._getframe(1)
        key = (id(frame), frame.f_lasti)
        last = self._last
        prev_op = None
        output_save = False
        if last is not None:
            last_info, last_out, last_key = last
            prev_op = last_info.name
            if last_key == key and not last_info.is_view and is_output(tensor, last_out):
                # The op that just ran saving its own output (sigmoid, exp, softmax...), unless
                # that output was already saved once: then the next op saves it as an input.
                owner, seen = self._consumed
                if owner is not last:
                    seen = []
                    self._consumed = (last, seen)
                if id(tensor) not in seen:
                    seen.append(id(tensor))
                    output_save = True
        info = SaveInfo(user_site(1), key, prev_op, output_save)
        if output_save:
            info.output_nr = tensor.output_nr
        else:
            grad_fn = tensor.grad_fn
            if grad_fn is not None and type(grad_fn).__name__ == "CppFunction" and _JIT_GRAPH_NODE in grad_fn.name():
                # TorchScript saves values as extra outputs of its graph node, through aliases that
                # are gone by the time backward runs; PyTorch's message names that node and output.
                info.producer = (grad_fn.name(), tensor.output_nr)
        with disable_torch_dispatch():
            alias = tensor.detach()
        # Holding ``tensor`` itself could form a cycle (output -> grad_fn -> record -> output),
        # so hold a detached alias (same memory and version counter) and a weak reference.
        rec = SavedRecord(alias, weakref.ref(tensor), tensor._version, info)
        self._pending.append(rec)
        storage = storage_key(tensor)
        if storage is not None:
            refs = self._index.get(storage)
            if refs is None:
                self._index[storage] = [weakref.ref(rec)]
            else:
                refs.append(weakref.ref(rec))
            self._since_sweep += 1
            if self._since_sweep > self._sweep_at:
                self._sweep()
        return rec

    def live_saves(self) -> int:
        """How many saved tensors autograd still holds (dropping the index entries of released ones)."""
        return self._sweep()

    def _sweep(self) -> int:
        """Drop index entries of records autograd already released (amortised O(1) per save).

        Returns how many indexed records are still alive.
        """
        live = 0
        index: dict[int, list[weakref.ref[SavedRecord]]] = {}
        for storage, refs in self._index.items():
            kept = [ref for ref in refs if ref() is not None]
            if kept:
                index[storage] = kept
                live += len(kept)
        self._index = index
        self._since_sweep = 0
        self._sweep_at = max(4096, 2 * live)
        return live

    def _unpack(self, rec: SavedRecord) -> torch.Tensor:
        """Backward needs the tensor: repeat PyTorch's version check, then hand it back."""
        if self._unsettled:
            self._settle_writes()
        if rec.info.node_name is None:
            node = current_autograd_node()
            if node is not None:
                rec.info.node_name = node.name()
        if rec.tensor._version != rec.version:
            self.settle_all()
            raise version_error(rec, self.cwd)
        return rec.tensor

    # -- reports ----------------------------------------------------------------------------

    def build_report(self, finding: Finding, severity: str, error: str) -> Report:
        """Turn a finding into a :class:`Report` (resolving sites and source text now)."""
        return finding_report(finding, severity, error, self.cwd)

    def reports(self, start: int = 0) -> list[Report]:
        """Warnings for every finding since index ``start`` of :attr:`findings`."""
        self.settle_all()
        return warning_reports(self.findings[start:], self.cwd)
