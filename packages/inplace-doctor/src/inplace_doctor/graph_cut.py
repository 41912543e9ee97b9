"""Graph cut: where the loss's ancestry stopped requiring grad.

``element 0 of tensors does not require grad and does not have a grad_fn`` is raised by
``backward()``, but the graph was cut upstream: a ``torch.no_grad()`` block, ``.detach()``, a
round trip through Python numbers or NumPy (``.item()``, ``.numpy()``, ``torch.tensor(...)``),
an integer result (``argmax``) or a module whose parameters are all frozen. Nothing is tracked
while the program runs (the per-operator cost stays the in-place doctor's); when the error comes,
the frame that called backward is still alive, so the loss's ancestry is followed through the
source: from the name backward was called on to the statement that bound it, then to the names
that statement read whose tensors (read from the frame) do not require grad either, until the
statements that cut the graph. Each gets a reason and, where one line can fix it, a changed line.
"""

from __future__ import annotations

import ast
import linecache
import sys
from types import FrameType

import torch
from torch.optim import Optimizer

from .frames import display_path, is_user_code
from .messages import DoctorError
from .report import GraphReport, Patch, Site
from .source import Binding, binding_of, dotted_name, frame_value, single_line, statement_at, torch_name

CUT_ERROR = "does not require grad and does not have a grad_fn"
NO_GRAD = "no_grad"
DETACH = "detach"
ROUND_TRIP = "round_trip"
INTEGER = "integer"
FROZEN = "frozen"
_LEAVING = {"item", "tolist", "numpy"}  # methods whose result is no tensor
_WRAPPERS = {"tensor", "as_tensor", "from_numpy"}  # torch.X(...) makes a new leaf from data
_INTEGER = {"argmax", "argmin", "long", "int", "bool", "round", "floor", "ceil", "sign"}
_REASONS = {
    NO_GRAD: "ran inside a `torch.no_grad()` block, so recorded no graph",
    DETACH: "lost the graph to `.detach()`",
    ROUND_TRIP: "went through Python numbers or NumPy (`.item()`, `.tolist()`, `.numpy()`, `torch.tensor(...)`), "
    "which autograd cannot follow",
    INTEGER: "became an integer or piecewise-constant result (`argmax`, `.long()`, `round`), which has no gradient",
    FROZEN: "came from a module whose optimised parameters all have `requires_grad=False`",
}
_LABELS = {NO_GRAD: "torch.no_grad()", DETACH: ".detach()", ROUND_TRIP: "round trip", INTEGER: "integer result",
           FROZEN: "frozen module"}
MAX_STATEMENTS = 64  # statements followed back from the loss


class GraphCutError(DoctorError):
    """PyTorch's "does not require grad and does not have a grad_fn" error with the doctor's report."""


def is_graph_cut_error(error: BaseException) -> bool:
    """True for PyTorch's "element 0 of tensors does not require grad" error."""
    return isinstance(error, RuntimeError) and not isinstance(error, DoctorError) and CUT_ERROR in str(error)


def explain_cut(error: RuntimeError, cwd: str) -> GraphCutError:
    """PyTorch's error, unchanged in message, carrying the report of where the graph was cut."""
    return GraphCutError.explaining(error, lambda: diagnose_cut(str(error), _caller(), cwd))


def _caller() -> FrameType | None:
    """The user frame that called backward (this runs while the failing call is on the stack)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and not is_user_code(frame.f_code):
        frame = frame.f_back
    return frame


def _names_read(node: ast.AST) -> list[str]:
    """Dotted names an expression reads (not the functions it calls), first seen first."""
    found: list[str] = []
    for child in ast.walk(node):
        if isinstance(child, (ast.Name, ast.Attribute)) and isinstance(getattr(child, "ctx", None), ast.Load):
            name = dotted_name(child)
            if name is not None and name not in found:
                found.append(name)
    return found


def _called_names(node: ast.AST) -> list[str]:
    return [n for c in ast.walk(node) if isinstance(c, ast.Call) for n in [dotted_name(c.func)] if n is not None]


def _no_grad_blocks(tree: ast.Module, line: int) -> list[ast.With]:
    blocks = []
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and node.lineno < line <= (node.end_lineno or node.lineno):
            if any(dotted_name(item.context_expr.func) in ("torch.no_grad", "no_grad") for item in node.items
                   if isinstance(item.context_expr, ast.Call)):
                blocks.append(node)
    return blocks


def _method_calls(node: ast.AST) -> list[str]:
    return [c.func.attr for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)]


def _optimised(frame: FrameType) -> set[int] | None:
    """Identities of the parameters the frame's optimizers update; None when it has no optimizer."""
    optimizers = [v for v in (*frame.f_locals.values(), *frame.f_globals.values()) if isinstance(v, Optimizer)]
    if not optimizers:
        return None
    return {id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]}


def _modules(value: ast.expr, frame: FrameType) -> list[torch.nn.Module]:
    found = (frame_value(frame, ast.parse(name, mode="eval").body) for name in _called_names(value))
    return [module for module in found if isinstance(module, torch.nn.Module)]


def _carries_grad(value: ast.expr, frame: FrameType, optimised: set[int] | None) -> bool:
    """Whether the statement's inputs would have given its result a graph (what was cut was meant to train)."""
    modules = _modules(value, frame)
    reads = [frame_value(frame, ast.parse(name, mode="eval").body) for name in _names_read(value)]
    if any(isinstance(v, torch.Tensor) and v.requires_grad for v in reads):
        return True
    if optimised is None or not modules:
        return True
    return any(id(p) in optimised for module in modules for p in module.parameters())


def _reason(binding: Binding, tree: ast.Module, frame: FrameType, optimised: set[int] | None) -> str | None:
    """Why the statement's result lost requires_grad, or None when it did not cut the graph here."""
    statement, value = binding.statement, binding.value
    if value is None or not _carries_grad(value, frame, optimised):
        return None
    if _no_grad_blocks(tree, statement.lineno):
        return NO_GRAD
    methods = set(_method_calls(value))
    if "detach" in methods:
        return DETACH
    wrappers = {name.rsplit(".", 1)[-1] for name in _called_names(value) if name.startswith(("torch.", "np."))}
    if methods & _LEAVING or wrappers & _WRAPPERS:
        return ROUND_TRIP
    if methods & _INTEGER or {"torch.argmax", "torch.argmin"} & set(_called_names(value)):
        return INTEGER
    for module in _modules(value, frame):
        parameters = [p for p in module.parameters() if optimised is None or id(p) in optimised]
        if parameters and not any(p.requires_grad for p in parameters):
            return FROZEN
    return None


class _Reconnect(ast.NodeTransformer):
    """Undo what cut the graph: drop ``.detach()``/``.item()``/``.numpy()``, unwrap ``torch.tensor(x)``.

    ``torch.tensor`` of a list (of tensors, once their ``.item()`` is gone) becomes ``torch.stack``.
    """

    def __init__(self, frame: FrameType) -> None:
        self.frame = frame

    def _is_list(self, node: ast.expr) -> bool:
        if isinstance(node, (ast.List, ast.ListComp, ast.Tuple)):
            return True
        name = dotted_name(node)
        value = frame_value(self.frame, ast.parse(name, mode="eval").body) if name is not None else None
        return isinstance(value, (list, tuple))

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and not node.args and not node.keywords:
            if func.attr in {"detach", "cpu", *_LEAVING}:
                return func.value
        name = dotted_name(func) or ""
        if name.rsplit(".", 1)[-1] in _WRAPPERS and name.startswith("torch.") and len(node.args) == 1:
            if not node.keywords:
                inner = node.args[0]
                if self._is_list(inner):
                    stack = ast.Attribute(ast.Name(name.split(".")[0], ast.Load()), "stack", ast.Load())
                    return ast.Call(stack, [inner], [])
                return inner
        return node


def _patch(binding: Binding, reason: str, lines: list[str], frame: FrameType) -> str | None:
    """The statement's line changed so its result keeps the graph; None when one line cannot do it."""
    statement = binding.statement
    simple = isinstance(statement, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign))
    code = single_line(statement, lines) if simple else None
    if code is None:
        return None
    if reason == NO_GRAD:
        torch_module = torch_name(frame)
        return f"with {torch_module}.enable_grad(): {code}" if torch_module else None
    if reason in (DETACH, ROUND_TRIP):
        changed = ast.unparse(ast.fix_missing_locations(_Reconnect(frame).visit(ast.parse(code).body[0])))
        return changed if changed != ast.unparse(ast.parse(code).body[0]) else None
    return None


def _follows(value: object) -> bool:
    """Whether a value read by a statement may carry the cut further up: a tensor without grad, a number, a list."""
    if isinstance(value, torch.Tensor):
        return not value.requires_grad
    return isinstance(value, (int, float, list)) and not isinstance(value, bool)


def _cuts(tree: ast.Module, frame: FrameType, failing: Binding) -> list[tuple[Binding, str]]:
    """Statements on the loss's ancestry that cut the graph, nearest to the loss first.

    ``failing`` is the backward's own statement, which may cut too (``torch.tensor(loss).backward()``).
    """
    optimised = _optimised(frame)
    found: list[tuple[Binding, str]] = []
    queue: list[tuple[str, int]] = []
    seen: set[tuple[str, int]] = set()
    binding: Binding | None = failing
    while binding is not None or queue:
        if binding is None:
            name, before = queue.pop(0)
            binding = binding_of(tree, before, name, augmented=True)
            if binding is None or (name, binding.statement.lineno) in seen or len(seen) >= MAX_STATEMENTS:
                binding = None
                continue
            seen.add((name, binding.statement.lineno))
        reason = _reason(binding, tree, frame, optimised)
        if reason is not None:
            found.append((binding, reason))
        for read in _names_read(binding.value) if binding.value is not None else ():
            if _follows(frame_value(frame, ast.parse(read, mode="eval").body)):
                queue.append((read, binding.statement.lineno))
        binding = None
    return found


def diagnose_cut(message: str, frame: FrameType | None, cwd: str) -> GraphReport | None:
    """The report for a backward on a tensor without graph: the lines that cut it, and the fix."""
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    lines = linecache.getlines(filename, frame.f_globals)
    if not lines:
        return None
    tree = ast.parse("".join(lines))
    failing = statement_at(tree, frame.f_lineno)
    if failing is None:
        return None
    value = failing.value if isinstance(failing, (ast.Expr, ast.Assign, ast.AugAssign)) else None
    cuts = _cuts(tree, frame, Binding(failing, ast.unparse(value) if value is not None else "loss", value))
    if not cuts:
        return None
    file = display_path(filename, cwd)
    sites: list[tuple[str, Site]] = []
    patches: list[Patch] = []
    by_reason: dict[str, list[str]] = {}
    for binding, reason in cuts:
        line = binding.statement.lineno
        site = Site(_LABELS[reason], file, line, lines[line - 1].strip())
        sites.append(("cut at", site))
        code = _patch(binding, reason, lines, frame)
        if code is not None:
            patches.append(Patch(file, line, code))
        by_reason.setdefault(reason, []).append(f"`{binding.name}` ({site.where()})")
    sites.append(("failed at", Site("backward()", file, failing.lineno, lines[failing.lineno - 1].strip())))
    remedy = (
        "; change " + ", ".join(f"{p.file}:{p.line} to `{p.code}`" for p in patches)
        if patches
        else "; compute the loss from tensors that keep their graph (outside `no_grad`, without `.detach()`, "
        "`.item()` or integer results, through parameters with `requires_grad=True`)"
    )
    reasons = [f"{' and '.join(names)} {_REASONS[reason]}" for reason, names in by_reason.items()]
    fix = "the loss's ancestry lost its graph: " + "; ".join(reasons) + remedy
    return GraphReport("graph_cut", message, sites, fix, patches)
