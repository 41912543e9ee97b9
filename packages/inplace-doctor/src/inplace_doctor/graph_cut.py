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
import inspect
import linecache
import sys
from types import FrameType
from typing import NamedTuple

import torch
from torch.optim import Optimizer

from .fixes import strip_comment
from .frames import display_path, is_user_code
from .messages import DoctorError
from .report import GraphReport, Patch, Site
from .source import Binding, binding_of, dotted_name, frame_value, single_line, statement_at, torch_name

CUT_ERROR = "does not require grad and does not have a grad_fn"
NO_GRAD = "no_grad"
INFERENCE = "inference_mode"
GRAD_OFF = "set_grad_enabled"
GRAD_TOGGLE = "set_grad_enabled_statement"
DECORATOR = "decorator"
DATA = "data"
FROZEN_TENSOR = "requires_grad_false"
DETACH = "detach"
ROUND_TRIP = "round_trip"
INTEGER = "integer"
FROZEN = "frozen"
_LEAVING = {"item", "tolist", "numpy"}  # methods whose result is no tensor
_WRAPPERS = {"tensor", "as_tensor", "from_numpy"}  # torch.X(...) makes a new leaf from data
_INTEGER = {"argmax", "argmin", "long", "int", "bool", "round", "floor", "ceil", "sign"}
_GRAD_OFF_DECORATORS = {"no_grad", "inference_mode", "set_grad_enabled"}
_REASONS = {
    NO_GRAD: "ran inside a `torch.no_grad()` block, so recorded no graph",
    INFERENCE: "ran inside a `torch.inference_mode()` block, so recorded no graph",
    GRAD_OFF: "ran inside a `torch.set_grad_enabled(False)` block, so recorded no graph",
    GRAD_TOGGLE: "ran after `torch.set_grad_enabled(False)` had turned gradients off, so recorded no graph",
    DECORATOR: "came from a helper decorated with `@torch.no_grad()` or `@torch.inference_mode()`, which records "
    "no graph",
    DATA: "was read through `.data`, which autograd does not follow",
    FROZEN_TENSOR: "was frozen with `requires_grad_(False)` (or `.requires_grad = False`)",
    DETACH: "lost the graph to `.detach()`",
    ROUND_TRIP: "went through Python numbers or NumPy (`.item()`, `.tolist()`, `.numpy()`, `torch.tensor(...)`), "
    "which autograd cannot follow",
    INTEGER: "became an integer or piecewise-constant result (`argmax`, `.long()`, `round`), which has no gradient",
    FROZEN: "came from a module whose optimised parameters all have `requires_grad=False`",
}
_LABELS = {NO_GRAD: "torch.no_grad()", INFERENCE: "torch.inference_mode()", GRAD_OFF: "torch.set_grad_enabled(False)",
           GRAD_TOGGLE: "torch.set_grad_enabled(False)",
           DECORATOR: "decorator", DATA: ".data", FROZEN_TENSOR: "requires_grad_(False)", DETACH: ".detach()",
           ROUND_TRIP: "round trip", INTEGER: "integer result", FROZEN: "frozen module"}
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


def _is_false(node: ast.expr | None, frame: FrameType | None) -> bool:
    """An argument that turns gradients off: the constant ``False`` or a name whose value is False."""
    if node is None:
        return False
    if isinstance(node, ast.Constant):
        return node.value is False
    return frame is not None and frame_value(frame, node) is False


def _first_argument(call: ast.Call, keyword: str) -> ast.expr | None:
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _grad_off(call: ast.expr, frame: FrameType | None) -> str | None:
    """Which grad-disabling context a ``with`` item or decorator is: ``no_grad``, ``inference_mode``..."""
    function = call.func if isinstance(call, ast.Call) else call
    name = (dotted_name(function) or "").rsplit(".", 1)[-1]
    arguments = call if isinstance(call, ast.Call) else ast.Call(function, [], [])
    if name == "no_grad":
        return NO_GRAD
    if name == "inference_mode":
        mode = _first_argument(arguments, "mode")
        return None if _is_false(mode, frame) else INFERENCE
    if name == "set_grad_enabled" and _is_false(_first_argument(arguments, "mode"), frame):
        return GRAD_OFF
    return None


def _no_grad_blocks(tree: ast.Module, line: int, frame: FrameType | None = None) -> list[tuple[ast.With, str]]:
    """The ``with`` blocks around ``line`` that turn gradients off, with which context each is."""
    blocks = []
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and node.lineno < line <= (node.end_lineno or node.lineno):
            for item in node.items:
                kind = _grad_off(item.context_expr, frame) if isinstance(item.context_expr, ast.Call) else None
                if kind is not None:
                    blocks.append((node, kind))
    return blocks


def _grad_turned_off(tree: ast.Module, line: int, frame: FrameType) -> ast.stmt | None:
    """The ``torch.set_grad_enabled(False)`` statement that left gradients off before ``line``, if any."""
    found: ast.stmt | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and node.lineno < line:
            name = (dotted_name(node.value.func) or "").rsplit(".", 1)[-1]
            if name == "set_grad_enabled" and (found is None or node.lineno > found.lineno):
                found = node if _is_false(_first_argument(node.value, "mode"), frame) else None
    return found


class Decorated(NamedTuple):
    """A grad-disabling decorator on a helper the statement calls: its file, line, text and kind."""

    filename: str
    line: int
    code: str
    kind: str


def _decorator(function: object, frame: FrameType) -> Decorated | None:
    """The ``@torch.no_grad()``/``@torch.inference_mode()`` line of a decorated helper, read from its source."""
    function = getattr(function, "__func__", function)
    inner = inspect.unwrap(function) if hasattr(function, "__wrapped__") else None  # type: ignore[arg-type]
    code = getattr(inner, "__code__", None)
    if code is None:
        return None
    lines = linecache.getlines(code.co_filename, getattr(inner, "__globals__", None))
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name:
            if not node.decorator_list or node.decorator_list[0].lineno != code.co_firstlineno:
                continue
            for decorator in node.decorator_list:
                kind = _grad_off(decorator, frame)
                if kind is not None:
                    return Decorated(code.co_filename, decorator.lineno, lines[decorator.lineno - 1].strip(), kind)
    return None


def _decorated_helpers(value: ast.expr, frame: FrameType) -> list[Decorated]:
    found = (frame_value(frame, ast.parse(name, mode="eval").body) for name in _called_names(value))
    return [d for d in (_decorator(f, frame) for f in found if callable(f)) if d is not None]


def _wraps_values(value: ast.expr) -> bool:
    """``torch.tensor(x)`` (``as_tensor``, ``from_numpy``) of something read from a name, not of a literal."""
    for call in ast.walk(value):
        if isinstance(call, ast.Call) and (dotted_name(call.func) or "").startswith(("torch.", "np.")):
            if (dotted_name(call.func) or "").rsplit(".", 1)[-1] in _WRAPPERS and _names_read(ast.Tuple(call.args)):
                return True
    return False


def _reads_data(value: ast.expr) -> bool:
    """``x.data`` (of a call's result or a name) is read: the value leaves autograd's view."""
    return any(isinstance(n, ast.Attribute) and n.attr == "data" and isinstance(n.ctx, ast.Load)
               for n in ast.walk(value))


def _comparison(value: ast.expr) -> bool:
    """The value is a comparison (``p > 0.5``), possibly followed by method calls (``.float().mean()``)."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        value = value.func.value
    return isinstance(value, ast.Compare)


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


def _reads_trainable(value: ast.expr, frame: FrameType) -> bool:
    """The statement calls a module or reads a tensor that requires grad (with gradients off, it recorded nothing)."""
    reads = [frame_value(frame, ast.parse(name, mode="eval").body) for name in _names_read(value)]
    return bool(_modules(value, frame)) or any(isinstance(v, torch.Tensor) and v.requires_grad for v in reads)


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
    blocks = _no_grad_blocks(tree, statement.lineno, frame)
    if blocks:
        return blocks[-1][1]
    if _decorated_helpers(value, frame):
        return DECORATOR
    methods = set(_method_calls(value))
    if "detach" in methods:
        return DETACH
    if _reads_data(value):
        return DATA
    if methods & _LEAVING or _wraps_values(value):
        return ROUND_TRIP
    functions = {name.rsplit(".", 1)[-1] for name in _called_names(value) if name.startswith("torch.")}
    if methods & _INTEGER or functions & _INTEGER or _comparison(value):
        return INTEGER
    if _grad_turned_off(tree, statement.lineno, frame) is not None and _reads_trainable(value, frame):
        return GRAD_TOGGLE
    for module in _modules(value, frame):
        parameters = [p for p in module.parameters() if optimised is None or id(p) in optimised]
        if parameters and not any(p.requires_grad for p in parameters):
            return FROZEN
    return None


class _Reconnect(ast.NodeTransformer):
    """Undo what cut the graph: drop ``.detach()``/``.item()``/``.numpy()``, unwrap ``torch.tensor(x)``.

    ``torch.tensor`` of a list (of tensors, once their ``.item()`` is gone) becomes ``torch.stack``.
    """

    def __init__(self, frame: FrameType | None) -> None:
        self.frame = frame

    def _is_list(self, node: ast.expr) -> bool:
        if isinstance(node, (ast.List, ast.ListComp, ast.Tuple)):
            return True
        name = dotted_name(node)
        known = name is not None and self.frame is not None
        value = frame_value(self.frame, ast.parse(name, mode="eval").body) if known else None
        return isinstance(value, (list, tuple))

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        return node.value if node.attr == "data" and isinstance(node.ctx, ast.Load) else node

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
    if reason in (NO_GRAD, GRAD_OFF, INFERENCE):
        torch_module = torch_name(frame)
        if torch_module is None:
            return None
        # Inside inference mode `enable_grad` is not enough: inference mode itself has to be left.
        context = "inference_mode(False)" if reason == INFERENCE else "enable_grad()"
        return f"with {torch_module}.{context}: {code}"
    if reason == FROZEN_TENSOR:
        changed = ast.unparse(_Unfreeze().visit(ast.parse(code).body[0]))
        return changed if changed != ast.unparse(ast.parse(code).body[0]) else None
    if reason in (DETACH, ROUND_TRIP, DATA):
        changed = ast.unparse(ast.fix_missing_locations(_Reconnect(frame).visit(ast.parse(code).body[0])))
        return changed if changed != ast.unparse(ast.parse(code).body[0]) else None
    return None


class _SoftArgmax(ast.NodeTransformer):
    """The first ``x.argmax(dim)`` / ``torch.argmax(x, dim)`` (or ``argmin``) as its soft-argmax.

    ``(x.softmax(dim) * torch.arange(x.shape[dim], device=x.device)).sum(dim)`` is the index the
    softmax's weights expect: near the argmax where one value dominates, and differentiable everywhere.
    An argmax over the flattened tensor or with ``keepdim`` is left as it is.
    """

    def __init__(self, torch_module: str) -> None:
        self.torch = torch_module
        self.done = False

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if self.done or name not in ("argmax", "argmin") or not isinstance(node.func, ast.Attribute):
            return node
        method = dotted_name(node.func.value) != self.torch
        arguments = list(node.args) if method else list(node.args[1:])
        value = node.func.value if method else (node.args[0] if node.args else None)
        keywords = {k.arg: k.value for k in node.keywords}
        dim = arguments[0] if arguments else keywords.get("dim")
        if value is None or dim is None or len(arguments) > 1 or set(keywords) - {"dim"}:
            return node
        self.done = True
        scores = value if name == "argmax" else ast.UnaryOp(ast.USub(), value)
        weights = ast.Call(ast.Attribute(scores, "softmax", ast.Load()), [dim], [])
        size = ast.Subscript(ast.Attribute(value, "shape", ast.Load()), dim, ast.Load())
        device = ast.keyword("device", ast.Attribute(value, "device", ast.Load()))
        arange = ast.Call(ast.Attribute(ast.Name(self.torch, ast.Load()), "arange", ast.Load()), [size], [device])
        return ast.Call(ast.Attribute(ast.BinOp(weights, ast.Mult(), arange), "sum", ast.Load()), [dim], [])


def _soft_argmax_candidate(binding: Binding, lines: list[str], frame: FrameType) -> str | None:
    """The statement with its argmax as a soft-argmax, a candidate that only a run can confirm."""
    torch_module = torch_name(frame)
    code = single_line(binding.statement, lines) if isinstance(binding.statement, (ast.Assign, ast.Expr)) else None
    if torch_module is None or code is None:
        return None
    rewrite = _SoftArgmax(torch_module)
    changed = rewrite.visit(ast.parse(code).body[0])
    return ast.unparse(ast.fix_missing_locations(changed)) if rewrite.done else None


class _Unfreeze(ast.NodeTransformer):
    """``x.requires_grad_(False)`` and ``x.requires_grad = False`` with ``True``."""

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(True) if node.value is False else node


def _freezes(statement: ast.stmt, name: str) -> bool:
    """The statement is ``name.requires_grad_(False)`` or ``name.requires_grad = False``."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        call = statement.value
        return (isinstance(call.func, ast.Attribute) and call.func.attr == "requires_grad_"
                and dotted_name(call.func.value) == name and _is_false(_first_argument(call, "requires_grad"), None))
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
        return (isinstance(target, ast.Attribute) and target.attr == "requires_grad"
                and dotted_name(target.value) == name and _is_false(statement.value, None))
    return False


def _freeze_of(tree: ast.Module, name: str, before: int) -> Binding | None:
    """The last statement before ``before`` that froze ``name``."""
    found = [node for node in ast.walk(tree)
             if isinstance(node, ast.stmt) and node.lineno < before and _freezes(node, name)]
    return Binding(max(found, key=lambda n: n.lineno), name, None) if found else None


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
            value = frame_value(frame, ast.parse(name, mode="eval").body)
            frozen = _freeze_of(tree, name, before) if isinstance(value, torch.Tensor) and value.is_leaf else None
            if frozen is not None and (name, frozen.statement.lineno) not in seen:
                seen.add((name, frozen.statement.lineno))
                found.append((frozen, FROZEN_TENSOR))
                binding = None
                continue
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


def _decorator_sites(binding: Binding, frame: FrameType, cwd: str) -> list[tuple[Site, Patch | None]]:
    """Each grad-disabling decorator of a helper the statement calls, and its line made ``@torch.enable_grad()``."""
    found = []
    for decorated in _decorated_helpers(binding.value, frame) if binding.value is not None else []:
        label = {NO_GRAD: "@torch.no_grad()", INFERENCE: "@torch.inference_mode()"}.get(
            decorated.kind, "@torch.set_grad_enabled(False)")
        file = display_path(decorated.filename, cwd)
        expression = ast.parse(strip_comment(decorated.code).lstrip("@"), mode="eval").body
        name = dotted_name(expression.func if isinstance(expression, ast.Call) else expression) or ""
        prefix = name.rsplit(".", 1)[0] + "." if "." in name else ""  # `torch.` as the decorator spells it
        found.append((Site(label, file, decorated.line, decorated.code),
                      Patch(file, decorated.line, f"@{prefix}enable_grad()")))
    return found


def _toggle_site(
    tree: ast.Module, line: int, frame: FrameType, file: str, lines: list[str]
) -> list[tuple[Site, Patch]]:
    """The ``torch.set_grad_enabled(False)`` statement that left gradients off, and it turned to ``True``."""
    toggle = _grad_turned_off(tree, line, frame)
    code = single_line(toggle, lines) if toggle is not None else None
    if toggle is None or code is None:
        return []
    site = Site("torch.set_grad_enabled(False)", file, toggle.lineno, lines[toggle.lineno - 1].strip())
    return [(site, Patch(file, toggle.lineno, ast.unparse(_Unfreeze().visit(ast.parse(code).body[0]))))]


def _module_freezes(tree: ast.Module, binding: Binding, frame: FrameType, file: str, lines: list[str]) -> list[Site]:
    """``model.requires_grad_(False)`` lines that froze a module the statement calls."""
    sites = []
    for name in _called_names(binding.value) if binding.value is not None else []:
        if isinstance(frame_value(frame, ast.parse(name, mode="eval").body), torch.nn.Module):
            frozen = _freeze_of(tree, name, binding.statement.lineno)
            if frozen is not None:
                line = frozen.statement.lineno
                sites.append(Site("requires_grad_(False)", file, line, lines[line - 1].strip()))
    return sites


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
    candidates: list[Patch] = []
    by_reason: dict[str, list[str]] = {}
    for binding, reason in cuts:
        line = binding.statement.lineno
        site = Site(_LABELS[reason], file, line, lines[line - 1].strip())
        if reason in (DECORATOR, GRAD_TOGGLE):  # the line to change turned gradients off for a whole scope
            found = _decorator_sites(binding, frame, cwd) if reason == DECORATOR else _toggle_site(tree, line, frame,
                                                                                                     file, lines)
            for cut, patch in found:
                if ("cut at", cut) not in sites:
                    sites.append(("cut at", cut))
                    patches.append(patch)
            sites.append(("ran at", Site("call", file, line, site.code)))
            by_reason.setdefault(reason, []).append(f"`{binding.name}` ({site.where()})")
            continue
        sites.append(("cut at", site))
        code = _patch(binding, reason, lines, frame)
        if code is not None:
            patches.append(Patch(file, line, code))
        if reason == INTEGER:
            candidate = _soft_argmax_candidate(binding, lines, frame)
            candidates += [Patch(file, line, candidate)] if candidate is not None else []
        if reason == FROZEN:
            sites += [("frozen by", s) for s in _module_freezes(tree, binding, frame, file, lines)]
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
    return GraphReport("graph_cut", message, sites, fix, patches, candidates=candidates)
