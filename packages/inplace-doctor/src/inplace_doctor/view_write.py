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
from types import FrameType, TracebackType

import torch

from .fixes import out_of_place, strip_comment
from .frames import display_path, is_user_code
from .messages import DoctorError
from .report import GraphReport, Patch, Site
from .source import Binding, binding_of, dotted_name, frame_value, single_line, statement_at, torch_name

LEAF_ERROR = "a leaf Variable that requires grad is being used in an in-place operation"
VIEW_OF_LEAF_ERROR = "a view of a leaf Variable that requires grad is being used in an in-place operation"
MULTIPLE_VIEWS_ERROR = "This view is the output of a function that returns multiple views"
NO_GRAD_VIEW_ERROR = "A view was created in no_grad mode and is being modified inplace"
LEAF_WRITE = "leaf_write"
VIEW_WRITE = "view_write"
_SIMPLE_STATEMENTS = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)


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
    return InplaceWriteError.explaining(error, lambda: diagnose_write(error, traceback, cwd))


def _write_frame(traceback: TracebackType | None) -> tuple[FrameType, int] | None:
    """The innermost user frame of the traceback and its line: where the write is."""
    found = None
    while traceback is not None:
        if is_user_code(traceback.tb_frame.f_code):
            found = traceback.tb_frame, traceback.tb_lineno
        traceback = traceback.tb_next
    return found


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


def _root(node: ast.expr) -> ast.expr:
    """The named tensor under subscripts: ``parts`` in ``parts[0][1:]``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node


def _out_of_place(statement: ast.stmt, lines: list[str]) -> str | None:
    """The write rebinding its name out of place: ``q = q * s`` for ``q *= s``, ``x = x.relu()`` for ``x.relu_()``.

    None unless the write is alone on its line and writes a plain name.
    """
    code = single_line(statement, lines)
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
    if not is_loop and single_line(statement, lines) is None:
        return None
    text = lines[statement.lineno - 1].rstrip("\n")
    source = text[value.col_offset : value.end_col_offset]
    single = isinstance(statement, ast.Assign) and not isinstance(statement.targets[0], (ast.Tuple, ast.List))
    if single and isinstance(frame_value(frame, ast.parse(name, mode="eval").body), torch.Tensor):
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
    statement = statement_at(tree, line)
    written = _written_expression(statement) if statement is not None else None
    if written is None:
        return None
    expression, how = written
    name = dotted_name(_root(expression))
    file = display_path(filename, cwd)
    write_code = lines[statement.lineno - 1].strip()
    write = Site(how, file, statement.lineno, write_code)
    made = binding_of(tree, statement.lineno, name) if name else None
    sites: list[tuple[str, Site]] = []
    if made is not None:
        made_line = made.statement.lineno
        sites.append(("made by", Site(_made_by(made.value), file, made_line, lines[made_line - 1].strip())))
    sites.append(("written by", write))
    message = str(error)
    patches: list[Patch] = []
    shown = f"`{name}`" if name else "the written tensor"
    if kind == LEAF_WRITE:
        torch_module = torch_name(frame)
        code = single_line(statement, lines) if isinstance(statement, _SIMPLE_STATEMENTS) else None
        if code is not None and torch_module is not None:
            patches.append(Patch(file, statement.lineno, f"with {torch_module}.no_grad(): {code}"))
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
        return dotted_name(func) or "call"
    return "assignment"
