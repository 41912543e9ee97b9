"""Reading the user's source around a failing line: statements, the names they bind, values in the frame.

The leaf/view and graph-cut reports run after PyTorch raised, with the user's frame still alive:
the statement at a line, the assignment that last bound a name (in the function, then the class
for ``self.x``, then the module), and the value an expression of names has in the frame.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from types import FrameType
from typing import NamedTuple

import torch

from .fixes import strip_comment


class Binding(NamedTuple):
    """A statement that binds a name: an assignment or a ``for`` header, and the value bound from."""

    statement: ast.stmt
    name: str
    value: ast.expr | None


def _statements(tree: ast.AST) -> Iterator[ast.stmt]:
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            yield node


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _own_statements(scope: ast.AST) -> Iterator[ast.stmt]:
    """Statements of ``scope`` outside nested definitions; a class's include its methods' (``self.x = ...``)."""
    stack = list(reversed(getattr(scope, "body", [])))
    while stack:
        node = stack.pop()
        yield node
        method = isinstance(node, ast.FunctionDef) and isinstance(scope, ast.ClassDef)
        if isinstance(node, _DEFINITIONS) and not method:
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            children = [n for n in getattr(node, field, []) if isinstance(n, (ast.stmt, ast.excepthandler))]
            stack.extend(reversed(children))


def statement_at(tree: ast.AST, line: int) -> ast.stmt | None:
    """The innermost statement that spans ``line``."""
    best: ast.stmt | None = None
    for node in _statements(tree):
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best.lineno and (node.end_lineno or 0) <= (best.end_lineno or 0):
                best = node
    return best


def dotted_name(node: ast.expr) -> str | None:
    """``self.fc.weight`` for a chain of attributes on a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _prefixes(name: str) -> list[str]:
    """``a.b.c``, ``a.b``, ``a``: the written name, then the objects that hold it."""
    parts = name.split(".")
    lowest = 2 if parts[0] == "self" and len(parts) > 1 else 1
    return [".".join(parts[:n]) for n in range(len(parts), lowest - 1, -1)]


def _targets(node: ast.expr) -> Iterator[str]:
    if isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            yield from _targets(element)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)
    else:
        name = dotted_name(node)
        if name is not None:
            yield name


def _bindings(scope: ast.AST, augmented: bool) -> Iterator[Binding]:
    """The assignments and ``for`` headers of ``scope`` (and ``x += y`` if ``augmented``), one per bound name."""
    for node in _own_statements(scope):
        if augmented and isinstance(node, ast.AugAssign):
            for name in _targets(node.target):
                yield Binding(node, name, node.value)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in _targets(target):
                    yield Binding(node, name, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            for name in _targets(node.target):
                yield Binding(node, name, node.value)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            for name in _targets(node.target):
                yield Binding(node, name, node.iter)


def _scopes(tree: ast.Module, line: int) -> list[ast.AST]:
    """The function around ``line`` (innermost first), then its class, then the module."""
    functions: list[ast.AST] = []
    classes: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, _DEFINITIONS) and node.lineno <= line <= (node.end_lineno or node.lineno):
            (classes if isinstance(node, ast.ClassDef) else functions).append(node)
    functions.sort(key=lambda n: -n.lineno)
    classes.sort(key=lambda n: -n.lineno)
    return [*functions, *classes, tree]


def binding_of(tree: ast.Module, line: int, name: str, augmented: bool = False) -> Binding | None:
    """The assignment that last bound ``name`` (or an object holding it) before ``line``, nearest scope first.

    In a function or class the binding may also come later (a method defined below, a loop's next turn).
    """
    for candidate in _prefixes(name):
        for scope in _scopes(tree, line):
            found = [b for b in _bindings(scope, augmented) if b.name == candidate]
            before = [b for b in found if b.statement.lineno < line]
            if before:
                return max(before, key=lambda b: b.statement.lineno)
            if found and not isinstance(scope, ast.Module):
                return found[0]
    return None


def torch_name(frame: FrameType) -> str | None:
    """The name under which the frame's module imported torch (``torch`` first)."""
    names = [key for key, value in frame.f_globals.items() if value is torch]
    return "torch" if "torch" in names else next(iter(names), None)


def frame_value(frame: FrameType, expression: ast.expr) -> object:
    """The value of a name, attribute or constant subscript in the frame; None for anything else."""
    for node in ast.walk(expression):
        if isinstance(node, ast.Call):
            return None
    try:
        code = compile(ast.Expression(expression), "<doctor>", "eval")
        return eval(code, frame.f_globals, dict(frame.f_locals))  # noqa: S307 - names and subscripts only
    except Exception:  # noqa: BLE001 - a property or index of the user's object may raise anything
        return None


def single_line(statement: ast.stmt, lines: list[str]) -> str | None:
    """The statement's source line without comment when the statement is alone on one line."""
    if statement.lineno != statement.end_lineno:
        return None
    text = lines[statement.lineno - 1]
    code = strip_comment(text.strip())
    if text[: statement.col_offset].strip() or len(code) != (statement.end_col_offset or 0) - statement.col_offset:
        return None
    return code
