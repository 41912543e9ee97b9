"""Fix suggestions that name the pattern behind an in-place modification.

The same hints serve the runtime reports and the static lint, so both speak alike.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass

from .frames import CallContext

AUGMENTED = "augmented"
INPLACE_FLAG = "inplace_flag"
SLICE_ASSIGN = "slice_assign"
DATA_WRITE = "data_write"
INPLACE_METHOD = "inplace_method"
OPTIMIZER = "optimizer"
FUNCTION_INPUT = "function_input"
BUFFER_COPY = "buffer_copy"
PARAMETRIZED_ASSIGN = "parametrized_assign"

_AUGMENTED_RE = re.compile(r"^(?P<target>[\w.\[\]:, ]+?)\s*(?P<op>\*\*|//|>>|<<|[-+*/%@&|^])=\s*(?P<value>.+)$")
_SUBSCRIPT_ASSIGN_RE = re.compile(r"^[\w.]+\s*\[.*\]\s*=[^=]")
# Assigning an attribute rebinds it; one that writes a tensor in place runs a setter, i.e. parametrize's.
_ATTRIBUTE_ASSIGN_RE = re.compile(r"^(?P<owner>[\w.]+)\.(?P<name>\w+)\s*=[^=]")
_METHOD_RE = re.compile(r"\.(?P<name>[a-z][a-z0-9_]*[a-z0-9])_\(")

HINTS: dict[str, str] = {
    AUGMENTED: "augmented assignment updates the tensor in place; write `x = x + y` instead of `x += y`",
    INPLACE_FLAG: "an `inplace=True` module or function overwrote its input; use `inplace=False`",
    SLICE_ASSIGN: (
        "assigning into a slice or mask writes in place; build a new tensor instead "
        "(`torch.where(mask, new, old)`, `torch.cat([...], dim=-1)`) or `clone()` before assigning"
    ),
    DATA_WRITE: (
        "writes through `.data` are invisible to autograd (no error, silently wrong gradients); "
        "use an out-of-place op, or change parameters under `torch.no_grad()` after backward"
    ),
    INPLACE_METHOD: "`foo_()` methods work in place; use the out-of-place `y = y.foo(...)`",
    OPTIMIZER: (
        "optimizer.step() changed parameters that a pending backward still needs; call every backward "
        "that uses this forward pass before step() (e.g. the second loss's backward before the first "
        "optimiser's step), or recompute the forward pass / detach after the step"
    ),
    FUNCTION_INPUT: (
        "a custom autograd.Function modified its input in forward; work on `x.clone()` or declare it "
        "with `ctx.mark_dirty(x)` and return it"
    ),
    BUFFER_COPY: (
        "a buffer reused across steps is overwritten with copy_(); rebind a fresh tensor "
        "(`state = new_state`) instead of `state.copy_(new_state)`"
    ),
    PARAMETRIZED_ASSIGN: (
        "assigning a parametrized tensor runs the parametrization's `right_inverse` and writes the result "
        "into its `original` in place, which the parametrization's forward saved; make the assignment after "
        "the backward (after the optimiser's step in a training loop), or before the forward that should use it"
    ),
}


@dataclass(frozen=True)
class Change:
    """What is known about one modification when a report is built."""

    op: str
    code: str
    context: CallContext
    hidden: bool


def strip_comment(code: str) -> str:
    """Source line without its trailing ``# comment`` (a ``#`` inside a string is kept)."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            if token.type == tokenize.COMMENT:
                return code[: token.start[1]].rstrip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code
    return code


def classify_change(change: Change) -> str:
    """Pick the pattern that best explains one runtime modification."""
    ctx, code, op = change.context, strip_comment(change.code), change.op
    if change.hidden or ".data" in code:
        return DATA_WRITE
    if ctx.optimizer is not None:
        return OPTIMIZER
    if ctx.autograd_function:
        return FUNCTION_INPUT
    if ctx.inplace_module is not None or ctx.inplace_functional is not None or "inplace=True" in code:
        return INPLACE_FLAG
    if _AUGMENTED_RE.match(code):
        return AUGMENTED
    if _SUBSCRIPT_ASSIGN_RE.match(code):
        return SLICE_ASSIGN
    if op in ("aten::set_", "aten::copy_") and _ATTRIBUTE_ASSIGN_RE.match(code):
        return PARAMETRIZED_ASSIGN
    if op.endswith("copy_") and ".copy_(" in code:
        return BUFFER_COPY
    return INPLACE_METHOD


def out_of_place(target: str, operator: str, value: str) -> str:
    """``target OP= value`` as the assignment that computes the same: ``target = target OP (value)``.

    ``g /= g.norm() + eps`` divides by the whole right-hand side, so a right-hand side that is
    itself an operation is parenthesised; a name, call, literal or subscript is not.
    """
    try:
        expression = ast.parse(value, mode="eval").body
    except SyntaxError:
        expression = None
    if expression is None or isinstance(expression, (ast.BinOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Lambda)):
        value = f"({value})"
    return f"{target} = {target} {operator} {value}"


def specific_hint(kind: str, change: Change) -> str:
    """The generic hint for ``kind``, made concrete with the user's own code where possible."""
    code, ctx = strip_comment(change.code), change.context
    if kind == AUGMENTED:
        match = _AUGMENTED_RE.match(code)
        if match:
            target, operator, value = match["target"].strip(), match["op"], match["value"].strip()
            return f"`{code}` updates `{target}` in place; write `{out_of_place(target, operator, value)}`"
    if kind == INPLACE_FLAG:
        name = ctx.inplace_module or ctx.inplace_functional
        if name:
            return f"`{name}(inplace=True)` overwrote its input; construct/call it with `inplace=False`"
    if kind == INPLACE_METHOD:
        match = _METHOD_RE.search(code)
        if match:
            name = match["name"]
            return f"`.{name}_()` works in place; use the out-of-place `y = y.{name}(...)`"
    if kind == PARAMETRIZED_ASSIGN:
        match = _ATTRIBUTE_ASSIGN_RE.match(code)
        if match:
            owner, name = match["owner"], match["name"]
            return (
                f"`{code}` runs the parametrization's `right_inverse` and writes the result into "
                f"`{owner}.parametrizations.{name}.original` in place, which the parametrization's forward saved; "
                "make the assignment after the backward (after the optimiser's step in a training loop), "
                "or before the forward that should use it"
            )
    if kind == OPTIMIZER and ctx.optimizer:
        return HINTS[OPTIMIZER].replace("optimizer.step()", f"{ctx.optimizer}.step()", 1)
    return HINTS[kind]


def suggest_fix(changes: list[Change]) -> str:
    """One fix sentence per distinct pattern among ``changes`` (first seen first)."""
    if not changes:
        return "a tensor saved for backward was changed in place; clone it before modifying, or use out-of-place ops"
    hints: list[str] = []
    for change in changes:
        hint = specific_hint(classify_change(change), change)
        if hint not in hints:
            hints.append(hint)
    return "; ".join(hints)
