"""The dispatch mode and saved-tensor hooks that watch saved tensors and the writes to them.

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
a frame read and two attribute stores. The mode's round trip into Python is the larger cost,
so the tracker leaves the dispatch stack while nothing it would see can matter: during
backward without ``create_graph`` (the version check lives in the unpack hook), and during an
optimiser step while no saved tensor is alive (after backward freed the graph).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from .fixes import Change, suggest_fix
from .frames import call_context, is_user_code, resolve, user_site
from .graph_cut import explain_cut, is_graph_cut_error
from .graph_freed import BackwardHistory, is_graph_freed_error, mark_carried_inputs
from .inplace_patch import propose_patch
from .messages import (
    PROBE_THREAD_PREFIX,
    VERSION_ERROR,
    DoctorError,
    SavedTensorModifiedError,
    pytorch_hint,
    pytorch_type_name,
)
from .records import (
    BACKWARD_SUFFIX,
    Finding,
    Modification,
    OpInfo,
    PendingWrite,
    SavedRecord,
    SaveInfo,
    is_output,
    observed_bumps,
    output_ids,
    written_tensors,
)
from .report import Report, Site, TensorInfo
from .torch_shim import (
    acquire_backward_entry,
    current_autograd_node,
    disable_torch_dispatch,
    innermost_mode,
    overlaps,
    release_backward_entry,
    restore_foreach_bumps,
    storage_key,
)

# Distinct findings kept per tracker; further ones only count (a loop repeating one bug is one finding).
MAX_FINDINGS = 256
# Operator facts are derived once per overload; the cache is cleared if a program keeps registering new ops.
MAX_CACHED_OPS = 8192
_OPS: dict[Any, OpInfo] = {}
_JIT_GRAPH_NODE = "DifferentiableGraphBackward"


def _op_info(func: Any) -> OpInfo:
    info = _OPS.get(func)
    if info is None:
        if len(_OPS) >= MAX_CACHED_OPS:
            _OPS.clear()
        info = _OPS[func] = OpInfo(func)
    return info


def _backward_outside_tracker(engine_run: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Run autograd's engine outside the tracker's mode (installed around ``_engine_run_backward``).

    The engine captures the dispatch mode stack when backward starts and restores it for every
    node, so the mode can only be left before entering the engine. Without ``create_graph``
    backward saves nothing, and a modified saved tensor is still caught by the unpack hook's
    version check; skipping the mode there removes a Python round trip per backward operator.
    """
    mode = innermost_mode() if innermost_mode is not None else None
    if not isinstance(mode, Tracker):
        return engine_run(*args, **kwargs)
    call = mode.backwards.start(args, kwargs)
    try:
        return _run_engine(mode, engine_run, args, kwargs)
    except RuntimeError as error:
        explained = explain_cut(error, mode.cwd) if is_graph_cut_error(error) else None
        if explained is not None and explained.reports:
            raise explained.with_traceback(error.__traceback__) from None
        if not is_graph_freed_error(error) or isinstance(error, DoctorError):
            raise
        raise mode.backwards.explain(error, call).with_traceback(error.__traceback__) from None


def _run_engine(mode: Tracker, engine_run: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    create_graph = args[3] if len(args) > 3 else kwargs.get("create_graph", False)
    if (
        create_graph
        # Nodes of other devices run on the engine's device threads, where only the mode (which the
        # engine carries over) sees what hooks write; a profiler already installed keeps its place.
        or not all(t.is_cpu for t in (args[0] if args else ()) if isinstance(t, torch.Tensor))
        or sys.getprofile() is not None
        or not mode.step_aside("backward")
    ):
        return engine_run(*args, **kwargs)
    sys.setprofile(mode._on_backward_python_event)
    try:
        return engine_run(*args, **kwargs)
    finally:
        sys.setprofile(None)
        mode.end_callback()
        mode.step_back()


def _passes_closure(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> bool:
    """Whether ``optimizer.step`` was given a closure, which runs forward and backward inside it.

    Step hooks receive the bound call's arguments, so ``args`` starts with the optimizer itself.
    """
    positional = args[1:] if args and args[0] is optimizer else args
    return any(a is not None for a in positional) or any(v is not None for v in kwargs.values())


class ThreadWrites(TorchDispatchMode):
    """The dispatch mode of a thread started under :func:`watch`: it only looks for writes.

    Saved tensors are recorded on the watching thread; here, writes into their memory are
    matched and handed to the tracker, with the thread's name. A write is settled (its version
    bump checked) at this thread's next operator, or by the tracker when it reports.
    """

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
        info = _OPS.get(func) or _op_info(func)
        tracker = self.tracker
        if self.unsettled:
            tracker.settle_thread(self)
        if info.writes is None or tracker.closed:
            return info.call(*args, **kwargs) if kwargs else info.call(*args)
        return tracker._run_writing(info, args, kwargs or {}, self)


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
        self.findings: list[Finding] = []
        self._finding_keys: dict[tuple, Finding] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._aside: str | None = None  # "backward" or "step" while the mode is off the stack
        self._thread = 0
        self._step_hooks: list[Any] = []
        self._engine_wrapped = False
        self.dropped_findings = 0  # distinct findings beyond MAX_FINDINGS, counted only
        self.closed = False
        self._lock = threading.Lock()  # findings are also added from other threads
        self._callback_frame: Any = None  # the user frame a backward pass called, while it runs
        # Held strongly: a finished thread's last write is settled only when the tracker reports.
        self._threads: list[ThreadWrites] = []
        self._previous_thread_profile: Any = None
        self.backwards = BackwardHistory(cwd)  # for "backward through the graph a second time"

    # -- activation -------------------------------------------------------------------------

    def __enter__(self) -> Tracker:
        self._engine_wrapped = acquire_backward_entry(_backward_outside_tracker)
        self._hooks.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._hooks.__exit__(None, None, None)
            self._release_engine()
            raise
        self._thread = threading.get_ident()
        self._previous_thread_profile = threading.getprofile()
        threading.setprofile(self._on_thread_start)
        self._step_hooks = [
            register_optimizer_step_pre_hook(self._before_step),
            register_optimizer_step_post_hook(self._after_step),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True
        threading.setprofile(self._previous_thread_profile)
        for handle in self._step_hooks:
            handle.remove()
        self._step_hooks = []
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

    # -- Python code called by a backward pass, and other threads ------------------------------

    def _on_backward_python_event(self, frame: Any, event: str, arg: Any) -> None:
        """Profile function during backward: put the mode back while the user's code runs.

        The engine's own operators stay outside the mode; hooks, a custom ``backward``, an
        optimizer step from a post-accumulate-grad hook and checkpoint recomputation are
        Python frames the engine calls, and their writes are seen like forward writes.
        """
        if event == "call":
            if self._callback_frame is None and is_user_code(frame.f_code):
                self._callback_frame = frame
                TorchDispatchMode.__enter__(self)
        elif event == "return" and frame is self._callback_frame:
            self.end_callback()

    def end_callback(self) -> None:
        """Leave the stack again when the user frame a backward pass called returns."""
        if self._callback_frame is not None:
            self._callback_frame = None
            self.settle()
            TorchDispatchMode.__exit__(self, None, None, None)
            self._forget_neighbours()

    def _on_thread_start(self, frame: Any, event: str, arg: Any) -> None:
        """``threading.setprofile`` hook: runs once at the start of every thread started while watching."""
        sys.setprofile(self._previous_thread_profile)
        thread = threading.current_thread()
        if self.closed or thread.name.startswith(PROBE_THREAD_PREFIX):
            return
        writes = ThreadWrites(self)
        with self._lock:
            if len(self._threads) >= 64:
                self._threads = [w for w in self._threads if w.unsettled or w.thread.is_alive()]
            self._threads.append(writes)
        writes.__enter__()  # for the thread's lifetime; a no-op pass-through once the watch is over

    def settle_thread(self, writes: ThreadWrites) -> None:
        """Settle the writes another thread made (called there, or here when reporting)."""
        with writes.lock:
            pending, writes.unsettled = writes.unsettled, []
        self._settle(pending)

    def _release_engine(self) -> None:
        if self._engine_wrapped:
            self._engine_wrapped = False
            release_backward_entry()

    # -- leaving the dispatch stack where it sees nothing useful ------------------------------

    def step_aside(self, reason: str) -> bool:
        """Take the mode off the dispatch stack; False (and nothing done) unless it is innermost."""
        if self._aside is not None or innermost_mode is None or innermost_mode() is not self:
            return False
        self.settle()
        TorchDispatchMode.__exit__(self, None, None, None)
        self._aside = reason
        self._forget_neighbours()
        return True

    def step_back(self) -> None:
        """Put the mode back on the dispatch stack after :meth:`step_aside`."""
        if self._aside is None:
            return
        self._aside = None
        self._forget_neighbours()
        TorchDispatchMode.__enter__(self)

    def _forget_neighbours(self) -> None:
        """Cut the links between saves and the operators around them.

        Operators the mode did not see ran in between, so "the operator before/after a save"
        would name the wrong one; those saves keep only their own evidence.
        """
        self._pending = []
        self._last = None

    def _before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        """Optimizer step pre-hook: leave the stack when no saved tensor is alive to be written.

        After backward freed the graph, a step's in-place updates (half of a training step's
        operators with per-parameter AdamW) cannot touch a saved tensor, and the step saves
        nothing. With a live graph (a step between forward and backward, or a retained graph as
        in a GAN) or a closure (which runs forward inside the step) the mode stays.
        """
        if threading.get_ident() != self._thread:
            return
        if self._aside == "step":
            self.step_back()  # a previous step raised, so its post-hook never ran
        if _passes_closure(optimizer, args, kwargs) or self._sweep() > 0:
            return
        self.step_aside("step")

    def _after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        """Optimizer step post-hook: back on the stack for the next forward pass."""
        if self._aside == "step" and threading.get_ident() == self._thread:
            self.step_back()

    # -- dispatch: every aten operator ------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch protocol
        info = _OPS.get(func) or _op_info(func)
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
            out = self._run_writing(info, args, kwargs or {})
        self._last = (info, output_ids(out), key)
        return out

    def _run_writing(self, info: OpInfo, args: tuple, kwargs: dict, thread: ThreadWrites | None = None) -> Any:
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
        self._settle(writes)

    def _settle(self, writes: list[PendingWrite]) -> None:
        for write in writes:
            rec = write.record
            after = rec.tensor._version
            bumped = after > write.before
            if not bumped and not overlaps(write.written, rec.tensor):
                continue
            with self._lock:
                self._add_modification(rec, Modification(write, not bumped, after))

    def _add_modification(self, rec: SavedRecord, mod: Modification) -> None:
        """Attach ``mod`` to its record and to the (deduplicated) list of findings."""
        if rec.mods is None:
            rec.mods = []
        rec.mods.append(mod)
        finding = rec.finding
        if finding is None:
            key = (rec.info.site, mod.op, mod.context.site, mod.hidden)
            finding = self._finding_keys.get(key)
            if finding is None:
                if len(self.findings) >= MAX_FINDINGS:
                    self.dropped_findings += 1
                    return
                finding = self._finding_keys[key] = Finding(rec)
                self.findings.append(finding)
            else:
                finding.count += 1
            rec.finding = finding
        finding.add(mod)

    def settle(self) -> None:
        """Process writes still waiting for their version bump (call before reading findings)."""
        if self._unsettled:
            self._settle_writes()

    def settle_all(self) -> None:
        """:meth:`settle`, and other threads' writes too (their operators have returned by now)."""
        self.settle()
        with self._lock:
            threads = list(self._threads)
        for writes in threads:
            if writes.unsettled:
                self.settle_thread(writes)

    # -- saved tensor hooks -----------------------------------------------------------------

    def _pack(self, tensor: torch.Tensor) -> SavedRecord:
        """Autograd saves ``tensor``: remember its version, site and memory; store a record."""
        if self._aside == "step" and threading.get_ident() == self._thread:
            # The step raised after leaving the stack; a new graph is being built, so rejoin now.
            self.step_back()
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
            raise self._version_error(rec)
        return rec.tensor

    # -- reports ----------------------------------------------------------------------------

    def _version_error(self, rec: SavedRecord) -> SavedTensorModifiedError:
        """PyTorch's exact error for ``rec``, with a report attached and appended as a note."""
        message = self._pytorch_message(rec)
        finding = Finding(rec)
        for mod in rec.mods or ():
            finding.add(mod)
        finding.current_version = rec.tensor._version
        report = self.build_report(finding, "error", message)
        error = SavedTensorModifiedError(message, [report])
        if hasattr(error, "add_note"):
            error.add_note("\n" + report.format())
        return error

    def _pytorch_message(self, rec: SavedRecord) -> str:
        """Reproduce PyTorch's message, including the ``which is output N of X`` clause."""
        t = rec.tensor
        info = rec.info
        producer: tuple[str, int] | None = info.producer
        if producer is not None:
            pass
        elif info.output_save and info.node_name is not None:
            # A saved output names the node that saved it, which is the failing node itself.
            producer = (info.node_name, info.output_nr)
        else:
            original = t if rec.orig_ref is None else rec.orig_ref()
            grad_fn = original.grad_fn if original is not None else None
            if grad_fn is not None:
                producer = (grad_fn.name(), original.output_nr)  # type: ignore[union-attr]
        clause = ""
        if producer is not None:
            clause = f", which is output {producer[1]} of {BACKWARD_SUFFIX.sub('', producer[0])},"
        shape = ", ".join(str(s) for s in t.shape)
        return (
            f"{VERSION_ERROR}: [{pytorch_type_name(t)} [{shape}]]{clause} is at version {t._version}; "
            f"expected version {rec.version} instead.{pytorch_hint()}"
        )

    def build_report(self, finding: Finding, severity: str, error: str) -> Report:
        """Turn a finding into a :class:`Report` (resolving sites and source text now)."""
        saved_at = resolve(finding.info.site, self.cwd)
        saved_by = Site(finding.info.saver(saved_at.code), saved_at.file, saved_at.line, saved_at.code)
        sites: list[Site] = []
        changes: list[Change] = []
        for mod in finding.mods:
            where = resolve(mod.context.site, self.cwd)
            sites.append(Site(mod.op, where.file, where.line, where.code, mod.thread, mod.in_backward))
            changes.append(Change(mod.op, where.code, mod.context, mod.hidden))
        dtype, shape, device, type_name = finding.meta
        tensor = TensorInfo(dtype, shape, device, finding.saved_version, finding.current_version, type_name)
        notes = []
        if any(mod.hidden for mod in finding.mods):
            notes.append("written without a version bump (through .data or an alias), so PyTorch cannot detect it")
        missing = finding.current_version - finding.saved_version - observed_bumps(finding)
        observed = True
        if missing > 0 and severity == "error":
            observed = False
            notes.append(
                f"{missing} version bump(s) came from code the doctor does not watch: outside doctor.watch(), "
                "a thread started before it, or a hook the autograd engine ran on a device thread"
            )
        fix = suggest_fix(changes)
        patches, no_patch = propose_patch(saved_by, sites, changes, finding.info.output_save, self.cwd)
        if no_patch is not None:
            fix = f"{fix}; {no_patch}"
        return Report(error, tensor, saved_by, sites, fix, severity, notes, finding.count, observed, patches)

    def reports(self, start: int = 0) -> list[Report]:
        """Warnings for every finding since index ``start`` of :attr:`findings`."""
        self.settle_all()
        out = []
        for finding in self.findings[start:]:
            hidden = all(mod.hidden for mod in finding.mods)
            op = finding.info.saver(resolve(finding.info.site, self.cwd).code)
            if hidden:
                text = (
                    f"tensor saved for backward by {op} was overwritten without a version bump; "
                    "backward will silently use the new values"
                )
            else:
                text = f"tensor saved for backward by {op} was modified in place before backward used it"
            out.append(self.build_report(finding, "warning", text))
        return out

