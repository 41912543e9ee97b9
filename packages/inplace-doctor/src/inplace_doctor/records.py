"""What the doctor remembers: saved tensors, the writes that touched them, and findings.

Everything here is plain bookkeeping; no PyTorch hook or private API is used.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .frames import CallContext, RawSite
from .messages import pytorch_type_name

_APPLY_RE = re.compile(r"(\w+)\.apply\(")
BACKWARD_SUFFIX = re.compile(r"Backward\d*$")
MAX_SPANS = 1024


class OpInfo:
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


# Operator facts are derived once per overload; the cache is cleared if a program keeps registering new ops.
MAX_CACHED_OPS = 8192
OPS: dict[Any, OpInfo] = {}  # the dispatch modes read it first (one dict lookup per operator)


def op_info(func: Any) -> OpInfo:
    """The facts of ``func``, derived and cached on its first call."""
    info = OPS.get(func)
    if info is None:
        if len(OPS) >= MAX_CACHED_OPS:
            OPS.clear()
        info = OPS[func] = OpInfo(func)
    return info


class SaveInfo:
    """Where and by which operator a tensor was saved; shared by records and findings."""

    __slots__ = ("site", "key", "prev_op", "next_op", "next_match", "output_save", "node_name", "output_nr", "producer")

    def __init__(self, site: RawSite | None, key: tuple[int, int], prev_op: str | None, output_save: bool):
        self.site = site
        self.key = key
        self.prev_op = prev_op
        self.next_op: str | None = None
        self.next_match = False
        self.output_save = output_save
        self.node_name: str | None = None
        self.output_nr = 0
        self.producer: tuple[str, int] | None = None  # (node, output) PyTorch's message names, when known early

    def saver(self, code: str) -> str:
        """Name of the forward operator that saved the tensor.

        Input saves happen just before their operator reaches the dispatch mode, output saves
        just after; the node name seen during backward, when available, decides between them.
        """
        candidates = [op for op in (self.prev_op, self.next_op) if op]
        if self.node_name is not None:
            wanted = _normalise(BACKWARD_SUFFIX.sub("", self.node_name))
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
            return BACKWARD_SUFFIX.sub("", self.node_name)
        return candidates[0] if candidates else "<unknown>"


def _normalise(op: str) -> str:
    """Compare aten names with autograd node names: ``aten::_softmax`` ~ ``Softmax``."""
    return op.rsplit("::", 1)[-1].replace("_", "").lower()


class Modification:
    """One in-place operator that wrote to a saved tensor after it was saved."""

    __slots__ = ("op", "context", "hidden", "before", "after", "thread", "in_backward")

    def __init__(self, write: PendingWrite, hidden: bool, after: int) -> None:
        self.op = write.op
        self.context = write.context
        self.hidden = hidden  # wrote the memory without bumping the version (``.data``, inference mode)
        self.before = write.before
        self.after = after
        self.thread = write.thread
        self.in_backward = write.in_backward


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

    __slots__ = ("info", "meta", "saved_version", "current_version", "mods", "count", "spans")

    def __init__(self, record: SavedRecord) -> None:
        t = record.tensor
        self.info = record.info
        self.meta = (str(t.dtype), list(t.shape), str(t.device), pytorch_type_name(t))
        self.saved_version = record.version
        self.current_version = record.version
        self.mods: list[Modification] = []
        self.count = 1
        self.spans: list[tuple[int, int]] = []  # (before, after] version ranges of the observed writes

    def add(self, mod: Modification) -> None:
        """Remember ``mod`` unless the same operator at the same line is already listed."""
        self.current_version = max(self.current_version, mod.after)
        if not mod.hidden and len(self.spans) < MAX_SPANS:
            self.spans.append((mod.before, mod.after))
        for known in self.mods:
            if (
                known.op == mod.op
                and known.context.site == mod.context.site
                and known.hidden == mod.hidden
                and known.thread == mod.thread
            ):
                return
        self.mods.append(mod)


def observed_bumps(finding: Finding) -> int:
    """How many of the finding's version bumps the observed writes account for.

    Writes settled together all see the final version, so their ranges overlap; counting the
    versions covered once gives the number of bumps explained.
    """
    covered = 0
    reach = finding.saved_version
    for before, after in sorted(finding.spans):
        start = max(before, reach)
        if after > start:
            covered += after - start
            reach = after
    return covered


class PendingWrite:
    """A write matched to a saved tensor, checked once the op's version bump has happened."""

    __slots__ = ("record", "written", "before", "op", "context", "thread", "in_backward")

    def __init__(
        self,
        record: SavedRecord,
        written: torch.Tensor,
        before: int,
        op: str,
        context: CallContext,
        thread: str,
        in_backward: bool,
    ) -> None:
        self.record = record
        self.written = written
        self.before = before
        self.op = op
        self.context = context
        self.thread = thread  # name of the thread that wrote
        self.in_backward = in_backward  # written by Python code that a backward pass called


def output_ids(out: Any) -> int | tuple[int, ...]:
    """Identities of an op's output(s): kept instead of the tensors so nothing lives longer."""
    if type(out) in (tuple, list):
        return tuple(id(o) for o in out)
    return id(out)


def is_output(tensor: torch.Tensor, out_ids: int | tuple[int, ...]) -> bool:
    """Whether ``tensor`` is (one of) the last op's output(s), by identity."""
    if type(out_ids) is int:
        return out_ids == id(tensor)
    return id(tensor) in out_ids  # type: ignore[operator]


def written_tensors(info: OpInfo, args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    """Tensors an operator writes, positional or keyword, single or in a list (``_foreach_*_``)."""
    for index, name in info.writes or ():
        value = args[index] if index < len(args) else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))
