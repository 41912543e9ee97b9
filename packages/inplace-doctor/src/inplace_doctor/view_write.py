"""In-place writes PyTorch refuses in forward: into a leaf that requires grad, or into a view it cannot track.

PyTorch raises these at the write itself (``a leaf Variable that requires grad is being used in
an in-place operation``, ``... is a view and is being modified inplace ... returns multiple
views``, ``A view was created in no_grad mode and is being modified inplace``) and names neither
the line that made the leaf or view nor the fix. Nothing is tracked while the program runs: when
such an error leaves :func:`watch`, the traceback's innermost user frame is the write; the
written tensor is read from that frame, and the line that made it is the nearest assignment of
its name in the source (in the function, then the class for ``self.x``, then the module).

Fixes: a write into a leaf (a parameter initialised or updated by hand) belongs under
``torch.no_grad()``; a view that cannot be written (an output of ``unbind``/``split``/``chunk``, a
view made under ``no_grad``) is written out of place when the write rebinds a plain name
(``q *= s`` becomes ``q = q * s``), which also keeps the write off any tensor saved for backward,
and is ``clone()``d where it is made otherwise (``parts[0][mask] = 0``).
"""

from __future__ import annotations

import ast
import linecache
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import NamedTuple

import torch

from .fixes import out_of_place, strip_comment
from .frames import display_path, is_user_code
from .messages import DoctorError
from .report import GraphReport, Patch, Site

LEAF_ERROR = "a leaf Variable that requires grad is being used in an in-place operation"
VIEW_OF_LEAF_ERROR = "a view of a leaf Variable that requires grad is being used in an in-place operation"
MULTIPLE_VIEWS_ERROR = "This view is the output of a function that returns multiple views"
NO_GRAD_VIEW_ERROR = "A view was created in no_grad mode and is being modified inplace"
LEAF_WRITE = "leaf_write"
VIEW_WRITE = "view_write"
_SIMPLE_STATEMENTS = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)


class Binding(NamedTuple):
    """A statement that binds a name: an assignment or a ``for`` header, and the value bound from."""

    statement: ast.stmt
    name: str
    value: ast.expr | None


class InplaceWriteError(DoctorError):
    """PyTorch's error for an in-place write into a leaf or an untrackable view, with the doctor's report."""


def write_error_kind(error: BaseException) -> str | None:
    """``"leaf_write"`` or ``"view_write"`` for the errors this module explains, else None."""
    if not isinstance(error, RuntimeError) or isinstance(error, DoctorError):
        return None
    message = str(error)
    if LEAF_ERROR in message or VIEW_OF_LEAF_ERROR in message:
        return LEAF_WRITE
    if MULTIPLE_VIEWS_ERROR in message or NO_GRAD_VIEW_ERROR in message:
        return VIEW_WRITE
    return None


def explain_write(error: RuntimeError, traceback: TracebackType | None, cwd: str) -> InplaceWriteError:
    """PyTorch's error, unchanged in message, carrying the report of the write and the leaf or view."""
    try:
        report = diagnose_write(error, traceback, cwd)
    except Exception:  # noqa: BLE001 - a diagnosis that fails must not replace PyTorch's error
        report = None
    explained = InplaceWriteError(str(error), [report] if report else [])
    if report is not None and hasattr(explained, "add_note"):
        explained.add_note("\n" + report.format())
    return explained


def _write_frame(traceback: TracebackType | None) -> tuple[FrameType, int] | None:
    """The innermost user frame of the traceback and its line: where the write is."""
    found = None
    while traceback is not None:
        if is_user_code(traceback.tb_frame.f_code):
            found = traceback.tb_frame, traceback.tb_lineno
        traceback = traceback.tb_next
    return found


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


def _innermost_statement(tree: ast.AST, line: int) -> ast.stmt | None:
    best: ast.stmt | None = None
    for node in _statements(tree):
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best.lineno and (node.end_lineno or 0) <= (best.end_lineno or 0):
                best = node
    return best


def _written_expression(statement: ast.stmt) -> tuple[ast.expr, str] | None:
    """The expression the statement writes in place, and how (``+=``, ``[...] =``, ``mul_``)."""
    if isinstance(statement, ast.AugAssign):
        return statement.target, f"{_OPERATORS.get(type(statement.op), '?')}="
    if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Subscript):
        return statement.targets[0].value, "[...] ="
    for node in ast.walk(statement):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if not name.endswith("_") or name.endswith("__"):
                continue
            if not _is_module(node.func.value):
                return node.func.value, name
            if node.args:  # ``torch.relu_(x)`` writes its first argument
                return node.args[0], name
    return None


_OPERATORS = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
}


def _is_module(node: ast.expr) -> bool:
    """``torch.nn.init`` in ``torch.nn.init.zeros_(w)``: a dotted name starting at a module, not a tensor."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in {"torch", "nn", "init", "F"}


def _dotted(node: ast.expr) -> str | None:
    """``self.fc.weight`` for a chain of attributes on a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _root(node: ast.expr) -> ast.expr:
    """The named tensor under subscripts: ``parts`` in ``parts[0][1:]``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node


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
        name = _dotted(node)
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


def _creation(tree: ast.Module, line: int, name: str, augmented: bool = False) -> Binding | None:
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


def _torch_name(frame: FrameType) -> str | None:
    """The name under which the frame's module imported torch (``torch`` first)."""
    names = [key for key, value in frame.f_globals.items() if value is torch]
    return "torch" if "torch" in names else next(iter(names), None)


def _value(frame: FrameType, expression: ast.expr) -> object:
    """The value of a name, attribute or constant subscript in the frame; None for anything else."""
    for node in ast.walk(expression):
        if isinstance(node, ast.Call):
            return None
    try:
        code = compile(ast.Expression(expression), "<doctor>", "eval")
        return eval(code, frame.f_globals, dict(frame.f_locals))  # noqa: S307 - names and subscripts only
    except Exception:  # noqa: BLE001 - a property or index of the user's object may raise anything
        return None


def _one_line(statement: ast.stmt, lines: list[str]) -> str | None:
    """The statement's source line without comment when the statement is alone on one line."""
    if statement.lineno != statement.end_lineno:
        return None
    text = lines[statement.lineno - 1]
    code = strip_comment(text.strip())
    if text[: statement.col_offset].strip() or len(code) != (statement.end_col_offset or 0) - statement.col_offset:
        return None
    return code


def _out_of_place(statement: ast.stmt, lines: list[str]) -> str | None:
    """The write rebinding its name out of place: ``q = q * s`` for ``q *= s``, ``x = x.relu()`` for ``x.relu_()``.

    None unless the write is alone on its line and writes a plain name.
    """
    code = _one_line(statement, lines)
    if code is None:
        return None
    text = lines[statement.lineno - 1]
    if isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
        value = text[statement.value.col_offset : statement.value.end_col_offset]
        return out_of_place(statement.target.id, _OPERATORS[type(statement.op)], value)
    call = statement.value if isinstance(statement, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
        name, method = call.func.value.id, call.func.attr[:-1]
        if call.func.attr.endswith("_") and hasattr(torch.Tensor, method):
            return f"{name} = {name}.{method}{text[call.func.end_col_offset : call.end_col_offset]}"
    return None


def _clone_patch(made: Binding, lines: list[str], frame: FrameType) -> str | None:
    """The making line with the view cloned: ``v = x[0].clone()``, ``a, b = (t.clone() for t in x.chunk(2))``."""
    statement, name, value = made
    if value is None or value.lineno != statement.lineno or value.end_lineno != statement.lineno:
        return None
    is_loop = isinstance(statement, (ast.For, ast.AsyncFor))
    if not is_loop and _one_line(statement, lines) is None:
        return None
    text = lines[statement.lineno - 1].rstrip("\n")
    source = text[value.col_offset : value.end_col_offset]
    single = isinstance(statement, ast.Assign) and not isinstance(statement.targets[0], (ast.Tuple, ast.List))
    if single and isinstance(_value(frame, ast.parse(name, mode="eval").body), torch.Tensor):
        simple = isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
        replacement = f"{source}.clone()" if simple else f"({source}).clone()"
    elif isinstance(statement, ast.Assign) and not single:
        replacement = f"(part.clone() for part in {source})"
    else:
        replacement = f"[part.clone() for part in {source}]"
    return strip_comment((text[: value.col_offset] + replacement + text[value.end_col_offset :]).strip())


def diagnose_write(error: RuntimeError, traceback: TracebackType | None, cwd: str) -> GraphReport | None:
    """The report for a refused in-place write: the line that made the leaf or view, the write, the fix."""
    kind = write_error_kind(error)
    where = _write_frame(traceback)
    if kind is None or where is None:
        return None
    frame, line = where
    filename = frame.f_code.co_filename
    lines = linecache.getlines(filename, frame.f_globals)
    if not lines:
        return None
    tree = ast.parse("".join(lines))
    statement = _innermost_statement(tree, line)
    written = _written_expression(statement) if statement is not None else None
    if written is None:
        return None
    expression, how = written
    name = _dotted(_root(expression))
    file = display_path(filename, cwd)
    write_code = lines[statement.lineno - 1].strip()
    write = Site(how, file, statement.lineno, write_code)
    made = _creation(tree, statement.lineno, name) if name else None
    sites: list[tuple[str, Site]] = []
    if made is not None:
        made_line = made.statement.lineno
        sites.append(("made by", Site(_made_by(made.value), file, made_line, lines[made_line - 1].strip())))
    sites.append(("written by", write))
    message = str(error)
    patches: list[Patch] = []
    shown = f"`{name}`" if name else "the written tensor"
    if kind == LEAF_WRITE:
        torch_name = _torch_name(frame)
        code = _one_line(statement, lines) if isinstance(statement, _SIMPLE_STATEMENTS) else None
        if code is not None and torch_name is not None:
            patches.append(Patch(file, statement.lineno, f"with {torch_name}.no_grad(): {code}"))
        fix = (
            f"{shown} is a leaf that requires grad (a parameter); a write that initialises or updates it "
            f"by hand is not part of the computation to differentiate, so run `{strip_comment(write_code)}` "
            f"(at {write.where()}) under `with torch.no_grad():`; if the write is meant to be differentiated, "
            "make it out of place into a new name"
        )
    else:
        origin = (
            "a view made under `torch.no_grad()`"
            if NO_GRAD_VIEW_ERROR in message
            else "one of several views returned by one call (`unbind`, `split`, `chunk`...)"
        )
        rebound = _out_of_place(statement, lines)
        cloned = _clone_patch(made, lines, frame) if made is not None else None
        if rebound is not None:
            # No clone needed, and no saved tensor can be overwritten by the write (``z.div_(z.norm())``).
            patches.append(Patch(file, statement.lineno, rebound))
            remedy = f"write it out of place, `{rebound}` (at {write.where()})"
        elif cloned is not None and made is not None:
            patches.append(Patch(file, made.statement.lineno, cloned))
            remedy = (
                f"`.clone()` it where it is made, `{cloned}` ({sites[0][1].where()}), "
                "so the write changes a tensor of its own"
            )
        else:
            remedy = "`.clone()` it where it is made, or make the write out of place"
        fix = f"{shown} is {origin}, which autograd cannot follow through an in-place write; {remedy}"
    return GraphReport(kind, message, sites, fix, patches)


def _made_by(value: ast.expr | None) -> str:
    """The call that made the leaf or view (``unbind``, ``nn.Parameter``...), ``indexing`` or ``assignment``."""
    while isinstance(value, ast.Subscript) and isinstance(value.value, (ast.Call, ast.Subscript)):
        value = value.value
    if isinstance(value, ast.Subscript):
        return "indexing"
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Attribute) and not _is_module(func):
            return func.attr
        return _dotted(func) or "call"
    return "assignment"
