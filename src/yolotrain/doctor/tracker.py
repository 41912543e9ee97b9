"""Runtime tracking of tensors saved for backward and of the in-place ops that modify them.

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

import functools
import os
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils import _python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

from .fixes import Change, suggest_fix
from .frames import CallContext, RawSite, call_context, resolve, user_site
from .report import Report, Site, TensorInfo, format_reports

T = TypeVar("T")

_VERSION_ERROR = "one of the variables needed for gradient computation has been modified by an inplace operation"
_APPLY_RE = re.compile(r"(\w+)\.apply\(")
_BACKWARD_SUFFIX = re.compile(r"Backward\d*$")
_ANOMALY_HINT = (
    " Hint: the backtrace further above shows the operation that failed to compute its gradient. "
    "The variable in question was changed in there or anywhere later. Good luck!"
)


class SavedTensorModifiedError(RuntimeError):
    """PyTorch's in-place modification error, raised with the doctor's diagnosis attached.

    It is a ``RuntimeError`` with PyTorch's exact message, so existing ``except`` clauses and
    message matching keep working; ``reports`` holds the :class:`Report` objects.
    """

    def __init__(self, message: str, reports: list[Report]) -> None:
        super().__init__(message)
        self.reports = reports


class InplaceWarning(UserWarning):
    """Warning category for modifications found by :func:`check_step`."""


class _OpInfo:
    """Per-operator facts derived once from its schema."""

    __slots__ = ("call", "name", "writes", "is_view", "foreach")

    def __init__(self, func: torch._ops.OpOverload) -> None:
        schema = func._schema
        self.call: Callable[..., Any] = getattr(func, "_op", func)
        self.name = schema.name
        writes = tuple(
            (index, arg.name)
            for index, arg in enumerate(schema.arguments)
            if arg.alias_info is not None and arg.alias_info.is_write
        )
        self.writes = writes or None
        # A view op's output is never what the op itself saves, which settles an ambiguity below.
        self.is_view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        self.foreach = self.name.startswith("aten::_foreach_") and writes != ()


class SaveInfo:
    """Where and by which operator a tensor was saved; shared by records and findings."""

    __slots__ = ("site", "key", "prev_op", "next_op", "next_match", "output_save", "node_name", "output_nr")

    def __init__(self, site: RawSite | None, key: tuple[int, int], prev_op: str | None, output_save: bool):
        self.site = site
        self.key = key
        self.prev_op = prev_op
        self.next_op: str | None = None
        self.next_match = False
        self.output_save = output_save
        self.node_name: str | None = None
        self.output_nr = 0

    def saver(self, code: str) -> str:
        """Name of the forward operator that saved the tensor.

        Input saves happen just before their operator reaches the dispatch mode, output saves
        just after; the node name seen during backward, when available, decides between them.
        """
        candidates = [op for op in (self.prev_op, self.next_op) if op]
        if self.node_name is not None:
            wanted = _normalise(_BACKWARD_SUFFIX.sub("", self.node_name))
            for test in (str.__eq__, str.startswith):
                for op in candidates:
                    if test(_normalise(op), wanted):
                        return op
        if self.output_save and self.prev_op:
            return self.prev_op
        if self.next_match and self.next_op:
            return self.next_op
        match = _APPLY_RE.search(code)
        if match:
            return f"{match.group(1)} (autograd.Function)"
        if self.node_name is not None:
            return _BACKWARD_SUFFIX.sub("", self.node_name)
        return candidates[0] if candidates else "<unknown>"


def _normalise(op: str) -> str:
    """Compare aten names with autograd node names: ``aten::_softmax`` ~ ``Softmax``."""
    return op.rsplit("::", 1)[-1].replace("_", "").lower()


class Modification:
    """One in-place operator that wrote to a saved tensor after it was saved."""

    __slots__ = ("op", "context", "hidden", "before", "after")

    def __init__(self, op: str, context: CallContext, hidden: bool, before: int, after: int) -> None:
        self.op = op
        self.context = context
        self.hidden = hidden  # wrote the memory without bumping the version (``.data``, inference mode)
        self.before = before
        self.after = after


class SavedRecord:
    """What autograd stores instead of the tensor while the tracker's hooks are installed."""

    __slots__ = ("tensor", "orig_ref", "version", "info", "mods", "finding", "__weakref__")

    def __init__(self, tensor: torch.Tensor, orig_ref: Any, version: int, info: SaveInfo) -> None:
        self.tensor = tensor
        self.orig_ref = orig_ref
        self.version = version
        self.info = info
        self.mods: list[Modification] | None = None
        self.finding: Finding | None = None


class Finding:
    """A saved tensor modified after saving, kept without holding the tensor itself."""

    __slots__ = ("info", "meta", "saved_version", "current_version", "mods", "count")

    def __init__(self, record: SavedRecord) -> None:
        t = record.tensor
        self.info = record.info
        self.meta = (str(t.dtype), list(t.shape), str(t.device), t.type())
        self.saved_version = record.version
        self.current_version = record.version
        self.mods: list[Modification] = []
        self.count = 1

    def add(self, mod: Modification) -> None:
        """Remember ``mod`` unless the same operator at the same line is already listed."""
        self.current_version = max(self.current_version, mod.after)
        for known in self.mods:
            if known.op == mod.op and known.context.site == mod.context.site and known.hidden == mod.hidden:
                return
        self.mods.append(mod)


class _PendingWrite:
    """A write matched to a saved tensor, checked once the op's version bump has happened."""

    __slots__ = ("record", "written", "before", "op", "context")

    def __init__(self, record: SavedRecord, written: torch.Tensor, before: int, op: str, context: CallContext):
        self.record = record
        self.written = written
        self.before = before
        self.op = op
        self.context = context


def _storage_key(tensor: torch.Tensor) -> int | None:
    """Identity of the memory a tensor lives in; views and ``.data`` aliases share it."""
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, TypeError):
        # Sparse tensors and wrapper subclasses without real memory have no single storage; in-place
        # writes to them cannot alias a saved dense tensor, so they are not tracked.
        return None


def _output_ids(out: Any) -> int | tuple[int, ...]:
    """Identities of an op's output(s): kept instead of the tensors so nothing lives longer."""
    if type(out) in (tuple, list):
        return tuple(id(o) for o in out)
    return id(out)


def _is_output(tensor: torch.Tensor, out_ids: int | tuple[int, ...]) -> bool:
    """Whether ``tensor`` is (one of) the last op's output(s), by identity."""
    if type(out_ids) is int:
        return out_ids == id(tensor)
    return id(tensor) in out_ids  # type: ignore[operator]


def _written_tensors(info: _OpInfo, args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    """Tensors an operator writes, positional or keyword, single or in a list (``_foreach_*_``)."""
    for index, name in info.writes or ():
        value = args[index] if index < len(args) else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _restore_foreach_bumps(written: list[torch.Tensor], before: list[int]) -> None:
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


# PyTorch has no public accessor for the innermost dispatch mode. Without it the tracker never
# steps aside for backward, which keeps it correct and only makes it slower.
_innermost_mode: Callable[[], Any] | None = getattr(_python_dispatch, "_get_current_dispatch_mode", None)


def _without_tracker_during_backward(engine_run: Callable[..., T]) -> Callable[..., T]:
    """Wrap autograd's entry into the C++ engine so that backward runs outside the tracker's mode.

    The engine captures the dispatch mode stack when backward starts and restores it for every
    node, so the mode can only be left before entering the engine. Without ``create_graph``
    backward saves nothing, and a modified saved tensor is still caught by the unpack hook's
    version check; skipping the mode there removes a Python round trip per backward operator.
    """

    @functools.wraps(engine_run)
    def run(*args: Any, **kwargs: Any) -> T:
        create_graph = args[3] if len(args) > 3 else kwargs.get("create_graph", False)
        mode = _innermost_mode() if _innermost_mode is not None else None
        if create_graph or not isinstance(mode, Tracker) or not mode.step_aside("backward"):
            return engine_run(*args, **kwargs)
        try:
            return engine_run(*args, **kwargs)
        finally:
            mode.step_back()

    run.__wrapped_by_doctor__ = True  # type: ignore[attr-defined]
    return run


def _install_backward_wrapper() -> None:
    """Wrap ``_engine_run_backward``, through which ``backward()`` and ``autograd.grad()`` enter the engine.

    It is private, so every lookup is guarded: where it is missing (or ``torch.autograd`` holds
    a different function under that name) nothing is wrapped and the mode keeps seeing backward
    operators, as it did before. ``torch.autograd`` binds its own name for it at import, so both
    modules are patched, as PyTorch itself does for non-strict tracing.
    """
    graph = torch.autograd.graph
    original = getattr(graph, "_engine_run_backward", None)
    if original is None or getattr(original, "__wrapped_by_doctor__", False):
        return
    if _innermost_mode is None or getattr(torch.autograd, "_engine_run_backward", None) is not original:
        return
    wrapped = _without_tracker_during_backward(original)
    graph._engine_run_backward = wrapped  # type: ignore[attr-defined]
    torch.autograd._engine_run_backward = wrapped  # type: ignore[attr-defined]


def _passes_closure(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> bool:
    """Whether ``optimizer.step`` was given a closure, which runs forward and backward inside it.

    Step hooks receive the bound call's arguments, so ``args`` starts with the optimizer itself.
    """
    positional = args[1:] if args and args[0] is optimizer else args
    return any(a is not None for a in positional) or any(v is not None for v in kwargs.values())


_HINTS: dict[bool, str] = {}


def _pytorch_hint() -> str:
    """The hint sentence PyTorch appends to the error, read from PyTorch itself once.

    The probe runs in a fresh thread because hooks and dispatch modes are thread-local, so it
    sees PyTorch's own check rather than ours.
    """
    anomaly = torch.is_anomaly_enabled()
    if anomaly:
        return _ANOMALY_HINT
    if False not in _HINTS:
        found: list[str] = []

        def probe() -> None:
            x = torch.ones(1, requires_grad=True)
            y = x.sigmoid()
            y.add_(1)
            try:
                y.sum().backward()
            except RuntimeError as exc:
                found.append(str(exc))

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        message = found[0] if found else ""
        cut = message.find(" instead.")
        _HINTS[False] = message[cut + len(" instead.") :] if cut >= 0 else ""
    return _HINTS[False]


class Tracker(TorchDispatchMode):
    """Records saved tensors and the in-place operators that touch them; see :func:`watch`."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # The default wraps __torch_dispatch__ in a dynamo-disabling shim that costs ~2 us per op.
        return False

    def __init__(self, cwd: str) -> None:
        super().__init__()
        self.cwd = cwd
        self._ops: dict[Any, _OpInfo] = {}
        self._index: dict[int, list[weakref.ref[SavedRecord]]] = {}
        self._pending: list[SavedRecord] = []
        self._unsettled: list[_PendingWrite] = []
        self._last: tuple[_OpInfo, int | tuple[int, ...], tuple[int, int]] | None = None
        self._consumed: tuple[object, list[int]] = (None, [])
        self._since_sweep = 0
        self._sweep_at = 4096
        self.findings: list[Finding] = []
        self._finding_keys: dict[tuple, Finding] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._aside: str | None = None  # "backward" or "step" while the mode is off the stack
        self._thread = 0
        self._step_hooks: list[Any] = []

    # -- activation -------------------------------------------------------------------------

    def __enter__(self) -> Tracker:
        _install_backward_wrapper()
        self._hooks.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._hooks.__exit__(None, None, None)
            raise
        self._thread = threading.get_ident()
        self._step_hooks = [
            register_optimizer_step_pre_hook(self._before_step),
            register_optimizer_step_post_hook(self._after_step),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._step_hooks:
            handle.remove()
        self._step_hooks = []
        try:
            if self._aside is None:
                super().__exit__(*exc)
        finally:
            self._aside = None
            self._hooks.__exit__(*exc)
            self.settle()
            # Saves still waiting for "the next operator" will not see one; drop the references.
            self._forget_neighbours()

    # -- leaving the dispatch stack where it sees nothing useful ------------------------------

    def step_aside(self, reason: str) -> bool:
        """Take the mode off the dispatch stack; False (and nothing done) unless it is innermost."""
        if self._aside is not None or _innermost_mode is None or _innermost_mode() is not self:
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
        info = self._ops.get(func)
        if info is None:
            info = self._ops[func] = _OpInfo(func)
        frame = sys._getframe(1)
        key = (id(frame), frame.f_lasti)
        if self._unsettled:
            self._settle_writes()
        if self._pending:
            self._resolve_pending(info.name, key)
        if info.writes is None:
            out = info.call(*args, **kwargs) if kwargs else info.call(*args)
        else:
            out = self._run_writing(info, args, kwargs or {})
        self._last = (info, _output_ids(out), key)
        return out

    def _run_writing(self, info: _OpInfo, args: tuple, kwargs: dict) -> Any:
        """Run an in-place/out= operator, noting every saved tensor in memory it writes."""
        hits: list[tuple[SavedRecord, torch.Tensor, int]] = []
        written = list(_written_tensors(info, args, kwargs))
        before = [t._version for t in written] if info.foreach else None
        for tensor in written:
            storage = _storage_key(tensor)
            refs = self._index.get(storage) if storage is not None else None
            if refs:
                for ref in refs:
                    rec = ref()
                    if rec is not None:
                        hits.append((rec, tensor, rec.tensor._version))
        out = info.call(*args, **kwargs)
        if before is not None:
            _restore_foreach_bumps(written, before)
        if hits:
            context = call_context(0)
            self._unsettled.extend(_PendingWrite(rec, t, before, info.name, context) for rec, t, before in hits)
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
        for write in writes:
            rec = write.record
            after = rec.tensor._version
            bumped = after > write.before
            if not bumped and not torch._C._overlaps(write.written, rec.tensor):
                continue
            self._add_modification(rec, Modification(write.op, write.context, not bumped, write.before, after))

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
            if last_key == key and not last_info.is_view and _is_output(tensor, last_out):
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
        with torch._C._DisableTorchDispatch():
            alias = tensor.detach()
        # Holding ``tensor`` itself could form a cycle (output -> grad_fn -> record -> output),
        # so hold a detached alias (same memory and version counter) and a weak reference.
        rec = SavedRecord(alias, weakref.ref(tensor), tensor._version, info)
        self._pending.append(rec)
        storage = _storage_key(tensor)
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
            node = torch._C._current_autograd_node()
            if node is not None:
                rec.info.node_name = node.name()
        if rec.tensor._version != rec.version:
            raise self._version_error(rec)
        return rec.tensor

    # -- reports ----------------------------------------------------------------------------

    def _version_error(self, rec: SavedRecord) -> SavedTensorModifiedError:
        """PyTorch's exact error for ``rec``, with a report attached and appended as a note."""
        message = self._pytorch_message(rec)
        finding = Finding(rec)
        finding.current_version = rec.tensor._version
        finding.mods = list(rec.mods or [])
        report = self.build_report(finding, "error", message)
        error = SavedTensorModifiedError(message, [report])
        if hasattr(error, "add_note"):
            error.add_note("\n" + report.format())
        return error

    def _pytorch_message(self, rec: SavedRecord) -> str:
        """Reproduce PyTorch's message, including the ``which is output N of X`` clause."""
        t = rec.tensor
        info = rec.info
        producer: tuple[str, int] | None = None
        if info.output_save and info.node_name is not None:
            # A saved output names the node that saved it, which is the failing node itself.
            producer = (info.node_name, info.output_nr)
        else:
            original = t if rec.orig_ref is None else rec.orig_ref()
            grad_fn = original.grad_fn if original is not None else None
            if grad_fn is not None:
                producer = (grad_fn.name(), original.output_nr)  # type: ignore[union-attr]
        clause = ""
        if producer is not None:
            clause = f", which is output {producer[1]} of {_BACKWARD_SUFFIX.sub('', producer[0])},"
        shape = ", ".join(str(s) for s in t.shape)
        return (
            f"{_VERSION_ERROR}: [{t.type()} [{shape}]]{clause} is at version {t._version}; "
            f"expected version {rec.version} instead.{_pytorch_hint()}"
        )

    def build_report(self, finding: Finding, severity: str, error: str) -> Report:
        """Turn a finding into a :class:`Report` (resolving sites and source text now)."""
        saved_at = resolve(finding.info.site, self.cwd)
        saved_by = Site(finding.info.saver(saved_at.code), saved_at.file, saved_at.line, saved_at.code)
        sites: list[Site] = []
        changes: list[Change] = []
        for mod in finding.mods:
            where = resolve(mod.context.site, self.cwd)
            sites.append(Site(mod.op, where.file, where.line, where.code))
            changes.append(Change(mod.op, where.code, mod.context, mod.hidden))
        dtype, shape, device, type_name = finding.meta
        tensor = TensorInfo(dtype, shape, device, finding.saved_version, finding.current_version, type_name)
        notes = []
        if any(mod.hidden for mod in finding.mods):
            notes.append("written without a version bump (through .data or an alias), so PyTorch cannot detect it")
        observed = sum(mod.after - mod.before for mod in finding.mods if not mod.hidden)
        missing = finding.current_version - finding.saved_version - observed
        if missing > 0 and severity == "error":
            notes.append(
                f"{missing} version bump(s) came from code the doctor does not watch: outside "
                "doctor.watch(), or inside a backward pass (hooks, custom backward)"
            )
        return Report(error, tensor, saved_by, sites, suggest_fix(changes), severity, notes, finding.count)

    def reports(self, start: int = 0) -> list[Report]:
        """Warnings for every finding since index ``start`` of :attr:`findings`."""
        self.settle()
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


_ACTIVE = threading.local()


def active_tracker() -> Tracker | None:
    """The tracker installed by an enclosing :func:`watch` on this thread, if any."""
    return getattr(_ACTIVE, "tracker", None)


class watch:  # noqa: N801 - used as a context manager, named like one
    """Track in-place modifications of saved tensors for the code in the ``with`` block.

    When backward fails because a saved tensor was modified, the ``RuntimeError`` PyTorch
    would raise is raised unchanged in type and message, with ``.reports`` and a note holding
    the diagnosis. The tracker is returned by ``__enter__``; its :meth:`Tracker.reports`
    lists modifications that did not (or not yet) raise. Nested ``watch()`` blocks share
    the outermost tracker.
    """

    def __init__(self, cwd: str | None = None) -> None:
        self._cwd = cwd or os.getcwd()
        self._tracker: Tracker | None = None
        self._owner = False

    def __enter__(self) -> Tracker:
        current = active_tracker()
        if current is not None:
            self._tracker = current
            return current
        self._tracker = Tracker(self._cwd)
        self._tracker.__enter__()
        self._owner = True
        _ACTIVE.tracker = self._tracker
        return self._tracker

    def __exit__(self, *exc: object) -> None:
        if self._owner and self._tracker is not None:
            _ACTIVE.tracker = None
            self._owner = False
            self._tracker.__exit__(*exc)


def check_step(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Report]:
    """Run ``fn(*args, **kwargs)`` once and report saved tensors modified in place.

    Finds modifications even when they do not raise (the backward that needs the tensor
    never runs, or runs later). Each report is also issued as an :class:`InplaceWarning`.
    Returns an empty list for clean code; a failing backward still raises.
    """
    with watch() as tracker:
        start = len(tracker.findings)
        fn(*args, **kwargs)
        reports = tracker.reports(start)
    for report in reports:
        warnings.warn(report.format(), InplaceWarning, stacklevel=2)
    return reports


def run_with_report(fn: Callable[..., T], *args: Any, file: Any = None, **kwargs: Any) -> T:
    """Run ``fn`` under :func:`watch`; if backward fails on a modified tensor, print the report.

    Meant for rerunning a training step that already failed without the doctor: the error
    is re-raised after the report is written to ``file`` (default ``sys.stderr``).
    """
    try:
        with watch():
            return fn(*args, **kwargs)
    except SavedTensorModifiedError as error:
        print(format_reports(error.reports), file=file or sys.stderr)
        raise


def is_inplace_error(error: BaseException) -> bool:
    """True for PyTorch's "modified by an inplace operation" error, with or without the doctor."""
    return isinstance(error, RuntimeError) and _VERSION_ERROR in str(error)
