"""The in-place report's fix as one changed line, where one line can fix it without changing the maths.

Three rewrites are right in general: the modifying statement made out of place when it rebinds a
name of its own scope (``x += y``, ``x.foo_(...)``, ``x.copy_(y)``, ``y = x.foo_(...)``), or
``.clone()`` appended where the saving line binds the saved output, so the later writes change the
copy and not the tensor autograd saved. Anything else (a write through a view, an attribute, a
closure, an optimiser step, ``.data``, an assignment to a parametrized tensor) needs another edit,
and the report says so; the edits of :mod:`inplace_doctor.edits` that may fix it are its candidates,
proposed once a run of the patched copy verified one (``--verify-fix``).
"""

from __future__ import annotations

import ast
import os
import re

from .edits import (
    call_receiver,
    clone_before_write,
    clone_saved_operand,
    merge_backward_calls,
    move_after_backward,
    parsed_source,
)
from .fixes import (
    AUGMENTED,
    BUFFER_COPY,
    DATA_WRITE,
    FUNCTION_INPUT,
    INPLACE_METHOD,
    OPTIMIZER,
    PARAMETRIZED_ASSIGN,
    SLICE_ASSIGN,
    Change,
    classify_change,
    out_of_place,
    strip_comment,
)
from .report import Patch, Site
from .source import single_line, statement_at

_INPLACE_CALL = re.compile(r"\.(?P<name>[a-z][a-z0-9_]*[a-z0-9])_\(")
_NO_PATCH = {
    OPTIMIZER: "the backward calls and the optimiser step must be reordered",
    DATA_WRITE: "the `.data` write must move after backward",
    PARAMETRIZED_ASSIGN: "the assignment must move to another place",
}
NO_SINGLE_LINE = "no rewrite of the writing line alone fixes this"


def _scope(tree: ast.Module, line: int) -> ast.AST:
    """The innermost function around ``line``, else the module."""
    functions = [
        node for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or 0)
    ]
    return max(functions, key=lambda node: node.lineno, default=tree)


def _assigned_in(scope: ast.AST, name: str, parameters: bool) -> bool:
    """Whether ``scope`` binds ``name`` by assignment (or as a parameter if ``parameters``)."""
    if parameters and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if name in {arg.arg for arg in [*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs]}:
            return True
    return any(
        isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store) for node in ast.walk(scope)
    )


def _read_after(scope: ast.AST, name: str, line: int) -> bool:
    return any(
        isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load) and node.lineno > line
        for node in ast.walk(scope)
    )


def _rewrite_modification(kind: str, site: Site, root: str) -> str | None:
    """The modifying statement made out of place, when that rebinds a name of its own scope."""
    parsed = parsed_source(os.path.join(root, site.file))
    if parsed is None:
        return None
    tree, lines = parsed
    statement = statement_at(tree, site.line)
    code = single_line(statement, lines) if statement is not None else None
    if code is None:
        return None
    scope = _scope(tree, site.line)
    parameters = kind == FUNCTION_INPUT  # the Function's own copy of its input; callers see the output
    if isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name) and kind == AUGMENTED:
        value = ast.get_source_segment("".join(lines), statement.value) or ""
        return out_of_place(statement.target.id, _operator(code), value) if value else None
    if isinstance(statement, ast.Expr) and kind in (INPLACE_METHOD, FUNCTION_INPUT, BUFFER_COPY):
        receiver = call_receiver(statement.value)
        if not isinstance(receiver, ast.Name) or not _assigned_in(scope, receiver.id, parameters):
            return None
        call = statement.value
        if kind == BUFFER_COPY and isinstance(call, ast.Call) and len(call.args) == 1 and call.func.value is receiver:
            return f"{receiver.id} = {ast.get_source_segment(''.join(lines), call.args[0])}"
        if kind == BUFFER_COPY:
            return None
        return f"{receiver.id} = {_out_of_place_calls(code)}"
    if isinstance(statement, ast.Assign) and kind == INPLACE_METHOD:
        receiver = call_receiver(statement.value)
        if isinstance(receiver, ast.Name) and not _read_after(scope, receiver.id, site.line):
            return _out_of_place_calls(code)
    return None


def _out_of_place_calls(code: str) -> str:
    """``x.mul_(a).add_(b)`` as ``x.mul(a).add(b)``."""
    return _INPLACE_CALL.sub(lambda match: f".{match.group('name')}(", code)


def _operator(code: str) -> str:
    """The operator of an augmented assignment: ``+`` of ``x += y``."""
    match = re.search(r"(\*\*|//|>>|<<|[-+*/%@&|^])=", strip_comment(code))
    return match.group(1) if match else ""


def _clone_saved_output(saved_by: Site, root: str) -> str | None:
    """``name = expr.clone()`` where the saving line binds one name to the output autograd saved."""
    parsed = parsed_source(os.path.join(root, saved_by.file))
    if parsed is None:
        return None
    tree, lines = parsed
    statement = statement_at(tree, saved_by.line)
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return None
    if not isinstance(statement.targets[0], ast.Name) or single_line(statement, lines) is None:
        return None
    value = ast.get_source_segment("".join(lines), statement.value)
    if isinstance(statement.value, (ast.Call, ast.Attribute, ast.Name, ast.Subscript)):
        return f"{statement.targets[0].id} = {value}.clone()"
    return f"{statement.targets[0].id} = ({value}).clone()"


def propose_patch(
    saved_by: Site, modified_by: list[Site], changes: list[Change], output_saved: bool, root: str
) -> tuple[list[Patch], list[Patch], str | None]:
    """The one-line patch that fixes the report, else no patch, the candidate edits, and the sentence that
    says why no single line fixes it."""
    kinds = [classify_change(change) for change in changes]
    blocking = next((_NO_PATCH[kind] for kind in kinds if kind in _NO_PATCH), None)
    if blocking is not None or not modified_by:
        reason = f"{NO_SINGLE_LINE}: {blocking or 'the modification was not observed'}"
        return [], _candidates(saved_by, modified_by, kinds, root), reason
    if len({(site.file, site.line) for site in modified_by}) == 1:
        code = _rewrite_modification(kinds[0], modified_by[0], root)
        if code is not None:
            return [Patch(modified_by[0].file, modified_by[0].line, code)], [], None
    if output_saved and FUNCTION_INPUT not in kinds:
        code = _clone_saved_output(saved_by, root)
        if code is not None:
            return [Patch(saved_by.file, saved_by.line, code)], [], None
    return [], _candidates(saved_by, modified_by, kinds, root), (
        f"{NO_SINGLE_LINE}: the tensor is written through a view, an attribute or another scope, "
        "so copy it where that write starts (`x = x.clone()` before it) or make the write out of place"
    )


def _candidates(saved_by: Site, modified_by: list[Site], kinds: list[str], root: str) -> list[Patch]:
    """The edits that may fix a report one line cannot, most specific first, each to be run before it is proposed.

    One write only: a write during backward (a hook, an optimiser step per parameter) leaves its hook or
    the two backward passes become one; a slice assignment writes a copy; a write between a forward pass
    and its backward moves after the backward; the saving line copies the operand that was written.
    """
    if len({(site.file, site.line) for site in modified_by}) != 1:
        return []
    site, kind = modified_by[0], kinds[0]
    found = []
    if site.in_backward:
        found.append(move_after_backward(site, root, out_of_hook=True))
        if kind == OPTIMIZER:
            found.append(merge_backward_calls(site.file, root))
    else:
        if kind == SLICE_ASSIGN:
            found.append(clone_before_write(site, root))
        found.append(move_after_backward(site, root, out_of_hook=False))
    found.append(clone_saved_operand(saved_by, site, root))
    return [patch for patch in dict.fromkeys(found) if patch is not None]
