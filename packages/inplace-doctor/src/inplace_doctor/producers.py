"""Where state carried across steps kept a freed graph: the line that produced it without ``detach()``.

The line that first used a tensor of a freed graph is rarely the one to change when the tensor is
state: it came out of a helper that detached only part of a tuple state (``return h.detach(), c``),
out of a cache that stored features with their graph (``cache[key] = backbone(x)``), or out of a
memory bank that enqueued them (``bank.append(key)``). Given the names that hold the freed graph in
the frame that called backward, this module reads the program's source for the statement that
produced their values and rewrites it to store or return them detached. Only single-line statements
are rewritten; anything else yields no producer, and the caller keeps its own fix.
"""

from __future__ import annotations

import ast
import linecache
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import CodeType, FrameType, FunctionType

import torch

from .fixes import strip_comment
from .frames import display_path, is_user_code
from .report import Site

# True when a value (a tensor, or a container of tensors) holds a node of the freed graph.
Holds = Callable[[object], bool]
# Methods that put their last positional argument into the container they are called on.
_STORES = {"append", "appendleft", "insert", "add", "put", "put_nowait", "setdefault"}
# Methods that take a value out of the container they are called on.
_FETCHES = {"get", "pop", "popleft", "__getitem__"}
_ITEMS_CHECKED = 32  # per end of a container: a memory bank may hold thousands of tensors


@dataclass(frozen=True)
class Producer:
    """The statement that produced a carried value without detaching it, and that statement fixed."""

    site: Site
    code: str  # the whole statement with the kept value detached
    name: str  # the name (in the frame that called backward) whose value it produced
    detached: str  # the detached expression, for the fix's words


def lookup(name: str, namespaces: list[dict[str, object]]) -> Iterator[object]:
    """Values ``name`` may denote: a variable, or ``a.b`` on any object in the namespaces with attribute ``b``."""
    head, *rest = name.split(".")
    for namespace in namespaces:
        if head in namespace and not rest:
            yield namespace[head]
        elif rest:
            for owner in ([namespace[head]] if head in namespace else list(namespace.values())):
                value = owner
                for attr in rest:
                    value = _attribute(value, attr)
                yield value


def _attribute(owner: object, name: str) -> object:
    """``owner.name`` of an instance, or None: a class, a missing name or a failing property."""
    if owner is None or isinstance(owner, type):
        return None
    try:
        return getattr(owner, name, None)
    except Exception:  # noqa: BLE001 - a property of the user's object may raise anything
        return None


def is_container(value: object) -> bool:
    return isinstance(value, (list, tuple, deque, dict))


def container_items(value: object) -> list[object]:
    """The items of a list, tuple, deque or dict (its values) to check: the first and last few."""
    items = list(value.values()) if isinstance(value, dict) else list(value)  # type: ignore[call-overload]
    if len(items) > 2 * _ITEMS_CHECKED:
        items = items[:_ITEMS_CHECKED] + items[-_ITEMS_CHECKED:]
    return items


def _source(filename: str, module_globals: dict[str, object]) -> tuple[ast.Module, list[str]] | None:
    lines = linecache.getlines(filename, module_globals)
    try:
        return ast.parse("".join(lines)), lines
    except SyntaxError:
        return None


def _scope(tree: ast.Module, code: CodeType) -> ast.AST:
    """The function definition that compiled to ``code`` (the module for module-level code)."""
    if code.co_name != "<module>":
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name:
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if first == code.co_firstlineno:
                    return node
    return tree


def _innermost_function(tree: ast.Module, line: int) -> ast.AST:
    found: ast.AST = tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or 0):
            if found is tree or node.lineno > found.lineno:  # type: ignore[attr-defined]
                found = node
    return found


def in_frame_scope(frame: FrameType, file: str, line: int, cwd: str) -> bool:
    """True when ``file:line`` is code of the function that ``frame`` runs (not of a function it called)."""
    filename = frame.f_code.co_filename
    if display_path(filename, cwd) != file:
        return False
    parsed = _source(filename, frame.f_globals)
    if parsed is None:
        return True
    tree, _ = parsed
    return _innermost_function(tree, line) is _scope(tree, frame.f_code)


def _detach_expression(text: str, node: ast.expr) -> str:
    simple = isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
    return f"{text}.detach()" if simple else f"({text}).detach()"


def _rewrite(lines: list[str], statement: ast.stmt, values: list[ast.expr]) -> tuple[str, list[str]] | None:
    """The single-line ``statement`` with each of ``values`` detached, and the detached expressions."""
    if statement.lineno != statement.end_lineno:
        return None
    text = lines[statement.lineno - 1].rstrip("\n")
    detached = []
    for node in sorted(values, key=lambda v: v.col_offset, reverse=True):
        if node.lineno != statement.lineno or node.end_lineno != statement.lineno:
            return None
        new = _detach_expression(text[node.col_offset : node.end_col_offset], node)
        text = text[: node.col_offset] + new + text[node.end_col_offset :]  # type: ignore[misc]
        detached.insert(0, new)
    return strip_comment(text.strip()), detached


def _is_detached(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("detach", "item", "tolist", "numpy"))


def _stores_into(tree: ast.AST, name: str) -> Iterator[tuple[ast.stmt, ast.expr]]:
    """Statements that put a value into the container ``name``: ``name[key] = v``, ``name.append(v)``..."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Subscript) and ast.unparse(target.value) == name:
                yield node, node.value
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = node.value
            if (isinstance(call.func, ast.Attribute) and call.func.attr in _STORES and call.args
                    and ast.unparse(call.func.value) == name):
                yield node, call.args[-1]


def _fetched_from(scope: ast.AST, name: str) -> Iterator[str]:
    """Containers that assignments to ``name`` in ``scope`` take its value from: ``name = cache[key]``..."""
    for node in ast.walk(scope):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and ast.unparse(node.targets[0]) == name):
            continue
        value = node.value
        if isinstance(value, ast.Subscript):
            yield ast.unparse(value.value)
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _FETCHES:
            yield ast.unparse(value.func.value)


def _helpers_assigning(scope: ast.AST, name: str, namespace: dict[str, object]) -> Iterator[FunctionType]:
    """The program's own functions whose result assignments in ``scope`` bind to ``name``: ``name = helper(...)``."""
    for node in ast.walk(scope):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and ast.unparse(node.targets[0]) == name
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)):
            helper = namespace.get(node.value.func.id)
            if isinstance(helper, FunctionType) and is_user_code(helper.__code__):
                yield helper


def _partial_return(helper: FunctionType, cwd: str) -> Producer | None:
    """A ``return a.detach(), b`` of ``helper``: a tuple state returned with only some parts detached."""
    code = helper.__code__
    parsed = _source(code.co_filename, helper.__globals__)
    if parsed is None:
        return None
    tree, lines = parsed
    scope = _scope(tree, code)
    if scope is tree:
        return None
    for node in ast.walk(scope):
        if not (isinstance(node, ast.Return) and isinstance(node.value, (ast.Tuple, ast.List))):
            continue
        parts = node.value.elts
        kept = [part for part in parts if not _is_detached(part) and not isinstance(part, ast.Starred)]
        if not kept or len(kept) == len(parts):
            continue  # every part detached, or none: not a state helper that forgot a part
        rewritten = _rewrite(lines, node, kept)
        if rewritten is not None:
            new, _ = rewritten
            kept_line = strip_comment(lines[node.lineno - 1].strip())
            site = Site("return", display_path(code.co_filename, cwd), node.lineno, kept_line)
            return Producer(site, new, f"{helper.__name__}()", new.removeprefix("return "))
    return None


def find_producer(frame: FrameType | None, names: list[str], holds: Holds, cwd: str) -> Producer | None:
    """The statement that produced the value of one of ``names`` (names in ``frame`` that hold the freed
    graph) without detaching it: a store into a container, or a helper's partial return of a tuple state."""
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    parsed = _source(filename, frame.f_globals)
    if parsed is None:
        return None
    tree, lines = parsed
    scope = _scope(tree, frame.f_code)
    namespaces = [frame.f_locals, frame.f_globals]

    def stored(container: str, name: str) -> Producer | None:
        for statement, value in _stores_into(tree, container):
            if _is_detached(value):
                continue
            rewritten = _rewrite(lines, statement, [value])
            if rewritten is not None:
                new, (detached,) = rewritten
                code = strip_comment(lines[statement.lineno - 1].strip())
                site = Site("store", display_path(filename, cwd), statement.lineno, code)
                return Producer(site, new, name, detached)
        return None

    for name in names:
        values = [value for value in lookup(name, namespaces) if holds(value)]
        if not values:
            continue
        if isinstance(values[0], torch.Tensor):  # taken out of a container that kept its graph
            for container in _fetched_from(scope, name):
                if any(holds(v) and is_container(v) for v in lookup(container, namespaces)):
                    found = stored(container, container)
                    if found is not None:
                        return found
        elif isinstance(values[0], tuple):  # a tuple state (an LSTM's (h, c)) made by a helper
            for helper in _helpers_assigning(scope, name, frame.f_globals):
                found = _partial_return(helper, cwd)
                if found is not None:
                    return found
        if is_container(values[0]):  # a cache or a memory bank the state was put into
            found = stored(name, name)
            if found is not None:
                return found
    return None
