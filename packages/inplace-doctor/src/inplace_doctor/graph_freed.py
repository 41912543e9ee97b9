"""Graph freed twice: which backward freed the graph, and which line carried a piece of it into a new one.

PyTorch's message (``Trying to backward through the graph a second time``) is raised at the
second ``backward()``; the lines to change are elsewhere. The tracker remembers the roots of
the last few backward passes that freed their graph (``retain_graph=False``); when the error
comes, the failing pass's graph is walked from its roots: the first nodes that belong to an
earlier pass's graph are the carried tensors, and the new nodes that consume them name the
line that used them (the line is written into each node's ``metadata`` when backward unpacks
its saved tensors, so it is known even after the node's saved tensors are freed).

The fix depends on whether the new graph repeats the computation that made the carried tensor
(it reaches the same parameters on its own): then the tensor is state carried across steps (an
RNN's hidden state, a running average, a queue of features) and ``.detach()`` where it is used
is the fix; otherwise a second backward through the same graph is meant (two losses on one
forward pass, a GAN's generator output) and ``retain_graph=True`` on the first backward is.
"""

from __future__ import annotations

import ast
import io
import linecache
import sys
import tokenize
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch

from .fixes import strip_comment
from .frames import RawSite, display_path, is_user_code, resolve, user_site
from .messages import DoctorError
from .producers import container_items, find_producer, in_frame_scope, is_container, lookup
from .report import GraphReport, Patch, Site
from .torch_shim import next_sequence_nr

FREED_ERROR = "Trying to backward through the graph a second time"
# Roots of this many earlier backward passes are kept (nodes cannot be weakly referenced). After a
# backward the nodes it ran hold no saved tensors; nodes it did not need (``autograd.grad`` for some
# inputs only) keep theirs until their root is dropped, so only a few are kept.
MAX_BACKWARDS = 4
USED_KEY = "inplace_doctor_first_use"  # node metadata: the first line that used it after its graph was freed
_ACCUMULATE = "AccumulateGrad"
_AUTOGRAD_DIR = torch.autograd.__file__.rsplit("/", 1)[0]


class GraphFreedError(DoctorError):
    """PyTorch's "backward through the graph a second time" error with the doctor's report."""


def is_graph_freed_error(error: BaseException) -> bool:
    """True for PyTorch's "backward through the graph a second time" error."""
    return isinstance(error, RuntimeError) and FREED_ERROR in str(error)


@dataclass(frozen=True)
class BackwardCall:
    """One backward pass that freed its graph: its roots and the user's line that started it."""

    roots: tuple[Any, ...]
    site: RawSite | None
    api: str  # "backward()" or "autograd.grad()"


def _api_name() -> str:
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(_AUTOGRAD_DIR) and frame.f_code.co_name == "grad":
            return "autograd.grad()"
        frame = frame.f_back
    return "backward()"


def _user_frame() -> FrameType | None:
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and not is_user_code(frame.f_code):
        frame = frame.f_back
    return frame


def _children(node: Any) -> Iterator[Any]:
    for child, _ in node.next_functions:
        if child is not None:
            yield child


def _walk(roots: Iterable[Any], keep: list[Any]) -> dict[int, Any]:
    """Every node reachable from ``roots`` by id; ``keep`` holds them so ids stay unique."""
    seen: dict[int, Any] = {}
    stack = [r for r in roots if r is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        keep.append(node)
        stack.extend(_children(node))
    return seen


def _leaves(nodes: Iterable[Any]) -> set[int]:
    """Identities of the leaf tensors (parameters) whose ``AccumulateGrad`` nodes are among ``nodes``."""
    return {id(node.variable) for node in nodes if type(node).__name__ == _ACCUMULATE}


def mark_carried_inputs(args: tuple, boundary: int) -> None:
    """Note on the graph node of each input made before the last freeing backward where it is used.

    Called by the tracker for every forward operator once a backward pass has freed a graph;
    an input without a graph (parameters, data, detached state) costs one attribute read.
    """
    for arg in args:
        if isinstance(arg, torch.Tensor):
            node = arg.grad_fn
            if node is not None and node._sequence_nr() < boundary:
                _note_use(node)
        elif type(arg) in (list, tuple):
            for item in arg:
                node = item.grad_fn if isinstance(item, torch.Tensor) else None
                if node is not None and node._sequence_nr() < boundary:
                    _note_use(node)


def _note_use(node: Any) -> None:
    metadata = node.metadata
    if USED_KEY not in metadata:
        metadata[USED_KEY] = user_site(3)


class BackwardHistory:
    """The recent backward passes of one tracker, and the diagnosis when one hits a freed graph."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd
        self._calls: deque[BackwardCall] = deque(maxlen=MAX_BACKWARDS)
        # Graph nodes numbered below this were made before the last backward that freed a graph.
        self.boundary = 0

    def start(self, args: tuple, kwargs: dict) -> BackwardCall | None:
        """Called as a backward pass starts; remembers it when it frees its graph."""
        outputs = args[0] if args else kwargs.get("t_outputs", ())
        retain = args[2] if len(args) > 2 else kwargs.get("retain_graph", False)
        roots = tuple(t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None)
        if not roots:
            return None
        call = BackwardCall(roots, user_site(2), _api_name())
        if not retain:
            self._calls.append(call)
            self.boundary = next_sequence_nr(roots)
        return call

    def explain(self, error: RuntimeError, call: BackwardCall | None) -> GraphFreedError:
        """PyTorch's error, unchanged in message, carrying the report of ``call`` hitting a freed graph."""
        return GraphFreedError.explaining(error, lambda: self.diagnose(str(error), call, _user_frame()))

    def diagnose(self, message: str, call: BackwardCall | None, frame: FrameType | None) -> GraphReport | None:
        if call is None:
            return None
        keep: list[Any] = []
        earlier = [c for c in self._calls if c is not call]
        owner: dict[int, BackwardCall] = {}
        for previous in earlier:  # oldest first: the first backward that freed a node names it
            for key in _walk(previous.roots, keep):
                owner.setdefault(key, previous)
        carries: list[tuple[Any, Any]] = []  # (new consumer or None for a root, old node)
        new_nodes: list[Any] = []
        used_by: dict[int, Any] = {}  # new node id -> the new node that first reached it
        seen: set[int] = set()
        stack: list[tuple[Any, Any]] = [(None, root) for root in call.roots]
        while stack:
            consumer, node = stack.pop()
            if id(node) in owner and type(node).__name__ != _ACCUMULATE:
                carries.append((consumer, node))
                continue
            if id(node) in seen:
                continue
            if consumer is not None:
                used_by[id(node)] = consumer
            seen.add(id(node))
            keep.append(node)
            new_nodes.append(node)
            stack.extend((node, child) for child in _children(node))
        if not carries:
            return None
        freed_by = owner[id(carries[0][1])]
        old_nodes = _walk([old for _, old in carries], keep).values()
        carried_leaves, new_leaves = _leaves(old_nodes), _leaves(new_nodes)
        # State carried across steps: the new graph repeats the computation that made the carried tensor
        # (it reaches the same parameters on its own), or the same backward line runs again, as in a loop
        # over batches whose later step reads a tensor an earlier step kept (a feature cache).
        repeated = call.site is not None and call.site == freed_by.site
        state = (repeated or bool(carried_leaves) and carried_leaves <= new_leaves) and carries[0][0] is not None
        first_uses = [_first_use(old, consumer, used_by) for consumer, old in carries]
        return self._report(message, call, freed_by, carries, first_uses, state, frame)

    def _report(
        self,
        message: str,
        call: BackwardCall,
        freed_by: BackwardCall,
        carries: list[tuple[Any, Any]],
        first_uses: list[RawSite | None],
        state: bool,
        frame: FrameType | None,
    ) -> GraphReport:
        where = resolve(freed_by.site, self.cwd)
        first = Site(freed_by.api, where.file, where.line, where.code)
        failing = resolve(call.site, self.cwd)
        sites = [("freed by", first)]
        carried_sites: list[Site] = []
        notes: list[str] = []
        for (consumer, _), used in zip(carries, first_uses):
            if used is None:
                continue
            where = resolve(used, self.cwd)
            site = Site(consumer.name(), where.file, where.line, where.code)
            if all((s.file, s.line) != (site.file, site.line) for s in carried_sites):
                carried_sites.append(site)
        if not carried_sites and any(consumer is not None for consumer, _ in carries):
            notes.append("the line that first used the old graph ran where the doctor does not watch (another thread)")
        sites += [("carried by", site) for site in carried_sites]
        sites.append(("failed at", Site(call.api, failing.file, failing.line, failing.code)))
        patches: list[Patch] = []
        if state and carried_sites:
            fix = self._carried_state_fix(first, carried_sites, [old for _, old in carries], frame, sites, patches)
        else:
            code = _retain_graph(strip_comment(first.code))
            if code is not None:
                patches.append(Patch(first.file, first.line, strip_comment(code)))
            fix = (
                f"the graph was already freed by `{strip_comment(first.code)}` ({first.where()}); "
                "if both backward passes are "
                f"meant, write `{code or 'retain_graph=True'}` there, or sum the losses and call backward once; "
                "if the second loss should not reach that graph, `.detach()` the tensor where it is used"
            )
        return GraphReport("graph_freed", message, sites, fix, patches, notes=notes)

    def _carried_state_fix(self, first: Site, carried_sites: list[Site], old_nodes: list[Any],
                           frame: FrameType | None, sites: list[tuple[str, Site]], patches: list[Patch]) -> str:
        """The fix of state carried across steps, in words; adds its sites and patches.

        The chain of the program's lines: the op that used the stale tensor (``carried by``), the call in
        the loop that passed it there when that op runs in another function (``passed at``), and the
        statement that produced it without detaching (``produced at``: a helper returning a tuple state
        detached in part, a store into a cache or a memory bank). The patch goes to the last of them found.
        """
        keep: list[Any] = []
        old = {key for key, node in _walk(old_nodes, keep).items() if type(node).__name__ != _ACCUMULATE}
        local = [s for s in carried_sites if frame is None or in_frame_scope(frame, s.file, s.line, self.cwd)]
        names = _carried_names(local, old, keep, frame)
        tensors = [n for n in names if not _names_containers(n, frame)]
        for site in local:
            code = _detach_names(strip_comment(site.code), tensors)
            if code is not None:
                patches.append(Patch(site.file, site.line, code))
        shown = ", ".join(f"`{n}`" for n in tensors) or "the carried tensor"
        verb = "hold" if len(tensors) > 1 else "holds"
        detached = ", ".join(f"`{n}.detach()`" for n in tensors) or "`.detach()`"
        where = carried_sites[0].where()
        passed = _passing_statement(frame, old, keep, self.cwd) if not local else None
        if passed is not None:  # the carrying line is in another function: the call in the loop passed the state
            site, name, code, parts = passed
            sites.insert(len(sites) - 1, ("passed at", site))
            patches[:] = [Patch(site.file, site.line, code)]
            shown, verb, where, detached = f"`{name}`", "holds", site.where(), f"`{parts}`"
            names = [*names, name]
        freed = f"the graph of an earlier step that `{strip_comment(first.code)}` ({first.where()}) freed"
        producer = find_producer(frame, names, lambda value: _holds_old_graph(value, old, keep), self.cwd)
        if producer is not None:
            sites.insert(len(sites) - 1, ("produced at", producer.site))
            patches[:] = [Patch(producer.site.file, producer.site.line, producer.code)]
            if producer.site.op == "return":
                return (
                    f"the state made by `{producer.name}` still holds {freed}: it detaches only part of it; "
                    f"detach every part where it is returned, `{producer.code}` at {producer.site.where()}, "
                    "so each step backpropagates through its own graph only (truncated backpropagation)"
                )
            return (
                f"`{producer.name}` keeps tensors that still hold {freed}; store them detached, "
                f"`{producer.detached}` at {producer.site.where()}, so each step backpropagates through its own "
                "graph only"
            )
        return (
            f"{shown} still {verb} {freed}; use {detached} at {where} "
            "so each step backpropagates through its own graph only (truncated backpropagation)"
        )


def _first_use(old: Any, consumer: Any, used_by: dict[int, Any]) -> RawSite | None:
    """The line that first used the carried tensor after its graph was freed.

    The tensor's own node is ``old`` itself or, when the tensor branched off the freed graph
    without being part of what that backward reached (an LSTM's returned state), one of the new
    nodes between ``old`` and the failing loss; the nearest one with a noted use is it.
    """
    node = old
    while node is not None:
        used = node.metadata.get(USED_KEY)
        if used is not None:
            return used
        node = consumer if node is old else used_by.get(id(node))
    return None


def _name_tokens(code: str) -> list[tuple[str, int, int]]:
    """Dotted names in a source line with their column spans, e.g. ``self.queue``."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    names: list[tuple[str, int, int]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.type == tokenize.NAME and (index == 0 or tokens[index - 1].string != "."):
            parts, end = [token.string], token.end[1]
            while (
                index + 2 < len(tokens) and tokens[index + 1].string == "." and tokens[index + 2].type == tokenize.NAME
            ):
                parts.append(tokens[index + 2].string)
                end = tokens[index + 2].end[1]
                index += 2
            called = index + 1 < len(tokens) and tokens[index + 1].string == "("
            if not called:
                names.append((".".join(parts), token.start[1], end))
            elif len(parts) > 1:  # `out.float()`: the object the method is called on
                prefix = ".".join(parts[:-1])
                names.append((prefix, token.start[1], token.start[1] + len(prefix)))
        index += 1
    return names


def _assignment_end(code: str) -> int:
    """Column after the top-level ``=`` of an assignment (0 when the line is no assignment)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return 0
    depth = 0
    for token in tokens:
        if token.string in "([{" and token.type == tokenize.OP:
            depth += 1
        elif token.string in ")]}" and token.type == tokenize.OP:
            depth -= 1
        elif token.string == "=" and depth == 0:
            return token.end[1]
    return 0


def _holds_old_graph(value: object, old: set[int], keep: list[Any], depth: int = 2) -> bool:
    """True when ``value``, a tensor or (``depth`` levels of) a container of tensors, reaches a node in ``old``."""
    if is_container(value):
        return depth > 0 and any(_holds_old_graph(item, old, keep, depth - 1) for item in container_items(value))
    if not isinstance(value, torch.Tensor) or value.grad_fn is None:
        return False
    return any(key in old for key in _walk([value.grad_fn], keep))


def _carried_names(sites: list[Site], old: set[int], keep: list[Any], frame: FrameType | None) -> list[str]:
    """Names on the carrying lines whose tensors, or containers of tensors, (now) hold a node of the freed graph."""
    namespaces = [frame.f_locals, frame.f_globals] if frame is not None else []
    found: list[str] = []
    for site in sites:
        start = _assignment_end(site.code)
        for name, column, _ in _name_tokens(site.code):
            if column < start or name in found:
                continue
            if any(_holds_old_graph(v, old, keep) for v in lookup(name, namespaces)):
                found.append(name)
    return found


def _names_containers(name: str, frame: FrameType | None) -> bool:
    """True when ``name`` denotes a list, tuple, deque or dict in ``frame`` (a cache, a memory bank)."""
    namespaces = [frame.f_locals, frame.f_globals] if frame is not None else []
    return any(is_container(value) for value in lookup(name, namespaces))


def _detached(name: str, value: object) -> str:
    """``name.detach()``, or for a tuple state (an LSTM's ``(h, c)``) every part of it detached."""
    if isinstance(value, (tuple, list)):
        return f"tuple(part.detach() for part in {name})"
    return f"{name}.detach()"


def _passing_statement(frame: FrameType | None, old: set[int], keep: list[Any],
                       cwd: str) -> tuple[Site, str, str, str] | None:
    """In the frame that called backward, the statement that passed a tensor (or a tuple of them) holding the
    freed graph to a call: its site, the name, the statement with that argument detached, and the detach."""
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    lines = linecache.getlines(filename, frame.f_globals)
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign) or node.lineno != node.end_lineno or not isinstance(node.value, ast.Call):
            continue
        for argument in node.value.args:
            if not isinstance(argument, ast.Name):
                continue
            value = frame.f_locals.get(argument.id, frame.f_globals.get(argument.id))
            parts = value if isinstance(value, (tuple, list)) else [value]
            if not any(_holds_old_graph(part, old, keep) for part in parts):
                continue
            detached = _detached(argument.id, value)
            text = lines[node.lineno - 1]
            code = strip_comment(text.strip())
            start = node.col_offset
            column = argument.col_offset - start
            changed = code[:column] + detached + code[column + len(argument.id):]
            site = Site("call", display_path(filename, cwd), node.lineno, code)
            return site, argument.id, changed, detached
    return None


def _detach_names(code: str, names: list[str]) -> str | None:
    """``code`` with every read of ``names`` (right of the assignment) detached; None when none is read."""
    start = _assignment_end(code)
    ends = [end for name, col, end in _name_tokens(code) if name in names and col >= start]
    if not ends:
        return None
    for end in reversed(ends):
        code = f"{code[:end]}.detach(){code[end:]}"
    return code


def _retain_graph(code: str) -> str | None:
    """The backward call on ``code`` with ``retain_graph=True`` added; None when it is not found."""
    for call in (".backward(", "autograd.grad("):
        start = code.find(call)
        if start < 0:
            continue
        depth, index = 0, start + len(call) - 1
        while index < len(code):
            if code[index] == "(":
                depth += 1
            elif code[index] == ")":
                depth -= 1
                if depth == 0:
                    inner = code[start + len(call) : index].strip()
                    joined = f"{inner}, retain_graph=True" if inner else "retain_graph=True"
                    return f"{code[: start + len(call)]}{joined}{code[index:]}"
            index += 1
    return None
