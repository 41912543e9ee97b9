"""NaN origin: the first operator whose result went non-finite, in forward or in backward.

A loss that turns NaN is reported by PyTorch, if at all, at the ``backward()`` that failed or the
step that printed ``nan``. Anomaly mode names a backward node but keeps a Python traceback of
every forward operator and checks every gradient, which costs several times the run.

Here a ``TorchFunctionMode`` checks each floating result with one fused ``isfinite(t).all()``.
A NaN made from inputs without NaN stops the program there. An infinity made from finite inputs
is only remembered, because programs make them on purpose in branches they then mask away
(``torch.where(x > 0, x.log(), 0)``); it is named as the first non-finite value when a NaN or a
non-finite gradient follows. Each node a forward operator records gets a hook that runs in
backward: the first node that turns finite gradients into non-finite ones stops the backward
with its name and the forward line that recorded it (``sqrt`` at 0, the ``norm`` of a zero
vector, the masked ``log`` of 0). The fix names the usual repair for the operator and, where
one line can carry it, the changed line. Where the repair is a guess only a run can check (the op of a
float16 overflow run in float32, a learning rate ten, a hundred or a thousand times lower), the
changed lines are candidates that ``--verify-fix`` runs and proposes once one ran clean.
"""

from __future__ import annotations

import ast
import linecache
import math
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction
from torch.overrides import TorchFunctionMode

from .frames import RawSite, resolve, user_site
from .messages import DoctorError
from .report import GraphReport, Patch, Site
from .source import single_line, statement_at

NAN_ORIGIN = "nan_origin"
_SKIPPED = {  # reads of attributes and uninitialised memory (``nn.Linear`` fills ``torch.empty`` afterwards)
    "empty", "empty_like", "new_empty", "empty_strided",
    "__get__", "__set__", "__repr__", "__format__", "__bool__", "__len__", "__iter__", "__getitem__",
}
_OPS = {  # the operator family of a forward function or a backward node, and the calls that spell it
    "log": {"log", "log2", "log10"},
    "sqrt": {"sqrt", "rsqrt"},
    "exp": {"exp", "exp2"},
    "div": {"div", "true_divide", "divide"},
    "norm": {"norm", "vector_norm", "vectornorm"},
    "acos": {"acos", "arccos"},
    "asin": {"asin", "arcsin"},
    "pow": {"pow", "float_power"},
    "logdet": {"logdet"},
}
# Ops whose result is finite whenever their inputs are: not checked (a NaN they pass on is found by
# the next op that is checked, and the op that made it was recorded when it did).
_PRESERVING = {
    "view", "reshape", "permute", "transpose", "contiguous", "flatten", "unflatten", "squeeze", "unsqueeze",
    "expand", "expand_as", "chunk", "split", "unbind", "narrow", "select", "cat", "stack", "clone", "detach",
    "relu", "relu_", "sigmoid", "tanh", "silu", "hardswish", "hardtanh", "max_pool2d", "adaptive_avg_pool2d",
    "interpolate", "pad", "zeros_like", "ones_like", "where", "masked_fill",
}
# Ops whose backward can turn finite gradients non-finite at finite inputs (sqrt and powers below 1 at 0,
# acos/asin at ±1, std at a constant): their nodes get the backward check; others only when their result
# was already non-finite.
_SINGULAR = {"sqrt", "rsqrt", "pow", "acos", "asin", "std", "var", "cdist", "norm"}
MAX_CUSTOM_NODES = 4096  # custom Function nodes hooked at once (a graph never run keeps its entries)
_LEAVING = {"item", "tolist"}  # the value leaves torch: a NaN in it is no longer masked
_DUNDER = {"truediv": "div", "rtruediv": "div", "itruediv": "div_", "radd": "add", "iadd": "add_", "rsub": "sub",
           "isub": "sub_", "rmul": "mul", "imul": "mul_", "rmatmul": "matmul", "rpow": "pow", "ipow": "pow_"}
_DIV_NAMES = {"__truediv__", "__rtruediv__", "__itruediv__", "div_", "true_divide"}
_BACKWARD = re.compile(r"(?:Linalg)?(\w+?)Backward\d*$")
_FIXES = {
    "log": "a `log` of 0 (or below): write `log(softmax(...))` as `log_softmax(...)`, clamp the input "
    "(`x.clamp_min(eps)`), or in a masked branch make the masked input safe too: "
    "`torch.where(mask, torch.log(torch.where(mask, x, 1.0)), 0)`",
    "sqrt": "a `sqrt` at 0 (or below), whose gradient is infinite (nan): take it of `x.clamp_min(eps)`, in every "
    "branch of a `torch.where` (a masked branch is still differentiated)",
    "exp": "an `exp` that overflowed: compute in log space (`logsumexp`, `log_softmax`, `softplus`) or clamp "
    "the exponent below the dtype's limit",
    "div": "a division by 0: keep the denominator away from 0 (`d.clamp_min(eps)`, as `F.normalize` does), "
    "or mask the rows whose denominator is 0 with the double `torch.where`",
    "norm": "the `norm` of a zero vector, whose gradient is 0/0: use `x.pow(2).sum(dim).clamp_min(eps).sqrt()`, "
    "or divide with `F.normalize(x, dim=..., eps=...)`",
    "acos": "an `acos`/`asin` at or past ±1, whose gradient is infinite there: clamp the input to "
    "`[-1 + eps, 1 - eps]`",
    "logdet": "a `logdet` of a matrix whose determinant is negative (or 0), which is nan: take "
    "`torch.linalg.slogdet(a).logabsdet` (and its `sign` where the sign matters), or build a positive-definite "
    "matrix (`a @ a.mT + eps * I`)",
    "pow": "a fractional power (`x ** 0.5`) at 0, whose gradient is infinite: raise `x.clamp_min(eps)` instead, "
    "or use `torch.linalg.vector_norm`, whose gradient at 0 is 0",
}
_OVERFLOW = (
    "a value overflowed {dtype} (largest {limit:.4g}): run this op in float32 (`.float()` its inputs, or "
    "`torch.autocast(..., enabled=False)` around it), scale the values down, or use bfloat16"
)
_GROWTH = (
    "values grew until they left the {dtype} range: lower the learning rate, clip the gradients "
    "(`torch.nn.utils.clip_grad_norm_`), or normalise the inputs"
)
_GENERIC = "keep this op's inputs inside its domain (`clamp`, an `eps` inside the op) or compute it in log space"


class NanOriginError(DoctorError):
    """A non-finite value's origin, found under ``watch(nan=True)``; ``reports`` holds the report."""


@dataclass(frozen=True)
class _Found:
    """One operator that made a non-finite value: its name, where it ran, and its inputs' ranges."""

    op: str
    family: str
    site: RawSite | None
    ranges: tuple[str, ...]
    dtype: torch.dtype
    denominator_min: float | None


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, torch.Tensor)]
    return []


def _floating(value: Any) -> list[torch.Tensor]:
    return [t for t in _tensors(value) if t.is_floating_point() and t.numel()]


def _finite(tensors: list[torch.Tensor]) -> bool:
    """Exact check: every element of every tensor is finite."""
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _made_non_finite(grads_in: tuple, grads_out: tuple) -> tuple[list, list] | None:
    """A backward node's (produced, received) gradient tensors when it turned finite incoming gradients
    (``grads_out``) into non-finite ones, else None."""
    produced = [g for g in grads_in if isinstance(g, torch.Tensor) and g.numel()]
    received = [g for g in grads_out if isinstance(g, torch.Tensor) and g.numel()]
    if not produced or _surely_finite(produced) or (received and not _surely_finite(received)):
        return None
    return produced, received


def _surely_finite(tensors: list[torch.Tensor]) -> bool:
    """The hot-path check: one read-only reduction per tensor and one host sync.

    A sum is finite when all its terms are, except when it overflows: then the exact check decides.
    """
    total = sum(t.detach().sum(dtype=torch.float32) for t in tensors)
    return math.isfinite(float(total)) or _finite(tensors)


def _has_nan(tensors: list[torch.Tensor]) -> bool:
    return any(bool(torch.isnan(t).any()) for t in tensors)


def _range(name: str, tensor: torch.Tensor) -> str:
    """``name: float32 [4, 3] min -1.2 max 3.4 nan no inf no`` (finite range over the finite entries)."""
    data = tensor.detach()
    finite = data[torch.isfinite(data)]
    span = f"min {finite.min().item():.4g} max {finite.max().item():.4g}" if finite.numel() else "no finite value"
    nan = "yes" if bool(torch.isnan(data).any()) else "no"
    inf = "yes" if bool(torch.isinf(data).any()) else "no"
    dtype = str(data.dtype).removeprefix("torch.")
    return f"{name}: {dtype} {list(data.shape)} {span}, nan {nan}, inf {inf}"


def _display(name: str) -> str:
    """``mul`` for ``__mul__``, ``div`` for ``__truediv__``: the operator as PyTorch's docs name it."""
    if name.startswith("__") and name.endswith("__"):
        core = name[2:-2]
        return _DUNDER.get(core, core)
    return name


def _family(name: str) -> str:
    """``log`` for ``log``/``Tensor.log``/``LogBackward0``; ``div`` for ``/``; the name itself otherwise."""
    match = _BACKWARD.match(name)
    stem = match.group(1).lower() if match else _display(name).lower()
    stem = stem.rstrip("_").removeprefix("linalg_").removeprefix("_foreach_")
    if name in _DIV_NAMES or stem in ("truediv", "rtruediv"):
        return "div"
    return next((family for family, spelled in _OPS.items() if stem in spelled), stem)


def _denominator(func_name: str, args: tuple) -> torch.Tensor | None:
    if _family(func_name) != "div" or len(args) < 2:
        return None
    other = args[0] if func_name == "__rtruediv__" else args[1]
    return other if isinstance(other, torch.Tensor) else None


def _scalars_finite(args: tuple, kwargs: dict) -> bool:
    """False when a Python number argument is inf or NaN: a fill or mask made on purpose."""
    values = [*args, *kwargs.values()]
    return all(math.isfinite(v) for v in values if isinstance(v, float))


class NanWatch(TorchFunctionMode):
    """Finds the first non-finite value and the operator that made it; see :func:`watch` (``nan=True``)."""

    def __init__(self, cwd: str) -> None:
        super().__init__()
        self.cwd = cwd
        self.active = True
        self._first: _Found | None = None  # the first op that made a non-finite value from finite inputs
        self._first_nan: _Found | None = None  # the first op that made a NaN from inputs without NaN
        self._custom_nodes: dict[int, Any] = {}  # custom Function nodes hooked and not yet run
        self._locating: list[_Found] | None = None  # set while a custom backward is rerun to find its line

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if not self.active or name in _SKIPPED:
            return result
        if self._locating is not None:
            self._locate(name, args, kwargs, result)
            return result
        if torch.is_grad_enabled():
            self._watch_custom_nodes(args)
        if name in _PRESERVING:
            return result
        if name in _LEAVING:
            leaving = _floating(args[0]) if args else []
            if leaving and not _surely_finite(leaving) and _has_nan(leaving):
                self._reached(name, args, kwargs, leaving)
            return result
        checked = _floating(args[0] if result is None and name.endswith("_") and args else result)
        if not checked:
            return result
        finite = _surely_finite(checked)
        if not finite:
            self._forward(name, args, kwargs, checked)
        if finite and _family(name) not in _SINGULAR:
            return result
        grad_fn = next((t.grad_fn for t in checked if t.grad_fn is not None), None)
        if grad_fn is not None and torch.is_grad_enabled() and not isinstance(grad_fn, BackwardCFunction):
            site = user_site(0)
            grad_fn.register_hook(lambda grads_in, grads_out: self._backward(grad_fn, site, grads_in, grads_out))
        return result

    def _watch_custom_nodes(self, args: tuple) -> None:
        """Hook the backward of each custom ``autograd.Function`` whose output this op consumes.

        ``Function.apply`` never reaches a function mode and its ``backward`` runs with the modes
        off, so the node is caught where its output is used; the hook finds the line in ``backward``.
        """
        for arg in args:
            node = arg.grad_fn if isinstance(arg, torch.Tensor) else None
            if isinstance(node, BackwardCFunction) and id(node) not in self._custom_nodes:
                self._custom_nodes[id(node)] = node
                if len(self._custom_nodes) > MAX_CUSTOM_NODES:
                    self._custom_nodes.pop(next(iter(self._custom_nodes)))
                site = user_site(0)
                node.register_hook(lambda grads_in, grads_out, node=node, site=site: self._custom_backward(
                    node, site, grads_in, grads_out))

    def _custom_backward(self, node: Any, site: RawSite | None, grads_in: tuple, grads_out: tuple) -> None:
        """A custom ``backward`` made non-finite gradients from finite ones: rerun it to find the line."""
        self._custom_nodes.pop(id(node), None)
        if not self.active:
            return
        gradients = _made_non_finite(grads_in, grads_out)
        if gradients is None:
            return
        produced, received = gradients
        self._locating = []
        try:
            with self, torch.no_grad():  # saved tensors are still held while the node's hooks run
                node._forward_cls.backward(node, *grads_out)
        except Exception:  # noqa: BLE001 - the rerun only looks for the line; the real backward already ran
            pass
        finally:
            located, self._locating = self._locating, None
        name = node.name()
        kind = "nan" if _has_nan(produced) else "inf"
        message = f"Function '{name}' returned {kind} values in its gradient"
        if not located:
            self._backward(node, site, grads_in, grads_out)
            return
        found = located[0]
        where = resolve(site, self.cwd)
        note = (f"{found.op} in `{node._forward_cls.__name__}.backward` (the custom autograd.Function whose output "
                f"is used at {where.file}:{where.line}) turned finite gradients into non-finite ones")
        self.active = False
        report = diagnose(message, found, None, "backward", self.cwd)
        report.notes[0] = note
        raise NanOriginError(message, [report])

    def _locate(self, name: str, args: tuple, kwargs: dict, result: Any) -> None:
        """While a custom ``backward`` is rerun: remember the first op that made a non-finite value."""
        outputs = _floating(result)
        if self._locating or not outputs or _surely_finite(outputs):
            return
        inputs = [t for t in _tensors(args) + _tensors(list(kwargs.values())) if t.is_floating_point() and t.numel()]
        if _finite(inputs) and _scalars_finite(args, kwargs):
            self._locating.append(self._found(name, args, kwargs, outputs, user_site(0)))

    def _found(self, name: str, args: tuple, kwargs: dict, outputs: list[torch.Tensor], site: RawSite | None) -> _Found:
        inputs = [t for t in _tensors(args) + _tensors(list(kwargs.values())) if t.is_floating_point()]
        ranges = [_range(f"input {i}", t) for i, t in enumerate(inputs)]
        ranges += [_range("output" if len(outputs) == 1 else f"output {i}", t) for i, t in enumerate(outputs)]
        denominator = _denominator(name, args)
        low = None
        if denominator is not None and denominator.numel():
            low = float(denominator.detach().min())
        return _Found(_display(name), _family(name), site, tuple(ranges), outputs[0].dtype, low)

    def _forward(self, name: str, args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> None:
        """Remember the first non-finite value and the first NaN; stop when a NaN flows on."""
        inputs = [t for t in _tensors(args) + _tensors(list(kwargs.values())) if t.is_floating_point() and t.numel()]
        nan_out, nan_in = _has_nan(outputs), _has_nan(inputs)
        if nan_out and nan_in:
            self._reached(name, args, kwargs, outputs)
            return
        if not _scalars_finite(args, kwargs):
            return
        first_nan = self._first_nan is None and nan_out
        first = self._first is None and (not inputs or _finite(inputs))
        if first_nan or first:
            found = self._found(name, args, kwargs, outputs, user_site(0))
            self._first_nan = found if first_nan else self._first_nan
            self._first = found if first else self._first

    def _reached(self, name: str, args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> None:
        """A NaN went through ``name`` unmasked: stop with the op that made it."""
        found = self._first_nan
        if found is None:  # the NaN came in from outside the watched code (data, a checkpoint)
            found = self._found(name, args, kwargs, outputs, user_site(0))
            self._stop(f"`{found.op}` received nan values made outside the watched code", found, None)
        self._stop(f"`{found.op}` returned nan values (they reached `{_display(name)}`)", found, None)

    def _backward(self, node: Any, site: RawSite | None, grads_in: tuple, grads_out: tuple) -> None:
        if not self.active:
            return
        gradients = _made_non_finite(grads_in, grads_out)
        if gradients is None:
            return
        produced, received = gradients
        saved = [(key, getattr(node, key, None)) for key in dir(node) if key.startswith("_saved_")]
        ranges = [_range(f"saved {key.removeprefix('_saved_')}", v) for key, v in saved
                  if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()]
        ranges += [_range(f"gradient in {i}", g) for i, g in enumerate(received)]
        ranges += [_range(f"gradient out {i}", g) for i, g in enumerate(produced)]
        other = getattr(node, "_saved_other", None)
        low = float(other.detach().min()) if isinstance(other, torch.Tensor) and other.numel() else None
        found = _Found(node.name(), _family(node.name()), site, tuple(ranges), produced[0].dtype, low)
        kind = "nan" if _has_nan(produced) else "inf"
        self._stop(f"Function '{node.name()}' returned {kind} values in its gradient", found, "backward")

    def _stop(self, message: str, found: _Found, phase: str | None) -> None:
        """Raise the report; checks stop so the unwinding program's own ops are not reported."""
        self.active = False
        report = diagnose(message, found, self._first, phase, self.cwd)
        raise NanOriginError(message, [report])


def _fix(found: _Found, first: _Found | None) -> str:
    origin = first or found
    if origin.family in _FIXES:
        return _FIXES[origin.family]
    if found.family in _FIXES:
        return _FIXES[found.family]
    if origin.dtype in (torch.float16, torch.bfloat16):
        return _OVERFLOW.format(dtype=str(origin.dtype).removeprefix("torch."), limit=torch.finfo(origin.dtype).max)
    if first is not None and origin.family in ("add", "sub", "mul", "matmul", "linear", "mse_loss", "pow"):
        return _GROWTH.format(dtype=str(origin.dtype).removeprefix("torch."))
    return _GENERIC


def diagnose(message: str, found: _Found, first: _Found | None, phase: str | None, cwd: str) -> GraphReport:
    """The report: the first non-finite forward value, the op or node that made the NaN, the fix."""
    sites: list[tuple[str, Site]] = []
    notes: list[str] = []
    origin_role = "backward node" if phase == "backward" else "forward op"
    same = first is not None and (first.op, first.site) == (found.op, found.site)
    if first is not None and not same:
        location = resolve(first.site, cwd)
        sites.append(("non-finite", Site(first.op, location.file, location.line, location.code)))
        notes.extend(f"{first.op}: {text}" for text in first.ranges)
    location = resolve(found.site, cwd)
    sites.append((origin_role, Site(found.op, location.file, location.line, location.code)))
    notes.extend(f"{found.op}: {text}" for text in found.ranges)
    if phase == "backward":
        notes.insert(0, f"the forward values were finite; {found.op} (recorded at {location.file}:{location.line}) "
                        "turned finite gradients into non-finite ones")
    patch_target = first if first is not None and (first.family in _FIXES or found.family not in _FIXES) else found
    patches = [p for p in [_patch(patch_target, cwd)] if p is not None]
    remedy = "".join(f"; change {p.file}:{p.line} to `{p.code}`" for p in patches)
    candidates = [] if patches else _candidates(first or found, cwd)
    return GraphReport(NAN_ORIGIN, message, sites, _fix(found, first) + remedy, patches, notes=notes,
                       candidates=candidates)


def _eps(dtype: torch.dtype) -> float:
    return 1e-12 if dtype in (torch.float32, torch.float64) else 1e-6


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _method(receiver: ast.expr, name: str, *args: ast.expr, **keywords: ast.expr) -> ast.Call:
    return ast.Call(ast.Attribute(receiver, name, ast.Load()), list(args),
                    [ast.keyword(k, v) for k, v in keywords.items()])


class _Repair(ast.NodeTransformer):
    """Rewrite the first call of the operator family in a statement with its usual repair."""

    def __init__(self, found: _Found, torch_module: str) -> None:
        self.found = found
        self.torch = torch_module
        self.done = False
        self.masks: list[tuple[ast.expr, bool]] = []  # (condition, branch taken when True) of enclosing wheres

    def _eps(self) -> ast.expr:
        return ast.Constant(_eps(self.found.dtype))

    def _operand(self, node: ast.Call) -> tuple[ast.expr | None, str]:
        """The operator's input and whether it is the receiver (``x.log()``) or the first argument."""
        if isinstance(node.func, ast.Attribute) and not node.args:
            return node.func.value, "receiver"
        return (node.args[0], "arg") if node.args else (None, "")

    def _slogdet(self, matrix: ast.expr) -> ast.expr:
        """``torch.linalg.slogdet(matrix).logabsdet``: the log of the determinant's magnitude, finite for det < 0."""
        linalg = ast.Attribute(ast.Name(self.torch, ast.Load()), "linalg", ast.Load())
        call = ast.Call(ast.Attribute(linalg, "slogdet", ast.Load()), [matrix], [])
        return ast.Attribute(call, "logabsdet", ast.Load())

    def _safe(self, value: ast.expr, family: str) -> ast.expr:
        if family == "sqrt":  # in a masked branch too: the masked values' gradient is 0 * finite
            return _method(value, "clamp_min", self._eps())
        if self.masks:
            condition, taken = self.masks[-1]
            where = ast.Attribute(ast.Name(self.torch, ast.Load()), "where", ast.Load())
            safe = ast.Constant(1.0)
            args = [condition, value, safe] if taken else [condition, safe, value]
            return ast.Call(where, args, [])
        if family in ("log", "sqrt"):
            return _method(value, "clamp_min", self._eps())
        if family == "exp":
            limit = math.floor(0.9 * math.log(torch.finfo(self.found.dtype).max))  # room for a sum of them
            return _method(value, "clamp", max=ast.Constant(float(limit)))
        return _method(value, "clamp", ast.Constant(-1 + 1e-6), ast.Constant(1 - 1e-6))

    def visit_Call(self, node: ast.Call) -> ast.AST:
        name = _call_name(node)
        if not self.done and name == "where" and len(node.args) == 3:
            condition = node.args[0]
            node.args[0] = self.visit(condition)
            for index, taken in ((1, True), (2, False)):
                self.masks.append((condition, taken))
                node.args[index] = self.visit(node.args[index])
                self.masks.pop()
            return node
        family = self.found.family
        # Inside a `where` every branch is differentiated, so each occurrence is made safe, not the first only.
        if (self.done and not self.masks) or name not in _OPS.get(family, set()):
            return self.generic_visit(node)
        self.done = True
        if family == "logdet":
            matrix, _ = self._operand(node)
            return self._slogdet(matrix) if matrix is not None else node
        if family == "log" and not self.masks:
            inner, _ = self._operand(node)
            if isinstance(inner, ast.Call) and _call_name(inner) == "softmax":
                inner.func = ast.Attribute(inner.func.value, "log_softmax", ast.Load()) if isinstance(
                    inner.func, ast.Attribute) else ast.Name("log_softmax", ast.Load())
                return inner
            if isinstance(inner, ast.Call) and _call_name(inner) == "det":  # log(det(a)): NaN for det < 0
                matrix, _ = self._operand(inner)
                if matrix is not None:
                    return self._slogdet(matrix)
        if family in ("log", "sqrt", "exp", "acos", "asin"):
            value, where = self._operand(node)
            if value is None:
                self.done = False
                return node
            if where == "receiver":
                node.func.value = self._safe(value, family)
            else:
                node.args[0] = self._safe(value, family)
            return node
        if family == "norm":
            value, where = self._operand(node)
            keywords = {k.arg: k.value for k in node.keywords if k.arg is not None}
            extra = len(node.args) > (0 if where == "receiver" else 1)
            if value is None or extra or not set(keywords) <= {"dim", "keepdim"}:
                self.done = False
                return node
            squares = _method(_method(value, "pow", ast.Constant(2)), "sum", **keywords)
            return _method(_method(squares, "clamp_min", self._eps()), "sqrt")
        self.done = False
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        family = self.found.family
        if self.done or (family, type(node.op)) not in (("div", ast.Div), ("pow", ast.Pow)):
            return self.generic_visit(node)
        if family == "pow":  # a fractional power of a base that reaches 0
            exponent = node.right
            if not (isinstance(exponent, ast.Constant) and isinstance(exponent.value, float) and exponent.value < 1):
                return self.generic_visit(node)
            self.done = True
            node.left = _method(node.left, "clamp_min", self._eps())
            return node
        low = self.found.denominator_min
        if low is None or low < 0:
            return node
        self.done = True
        node.right = _method(node.right, "clamp_min", self._eps())
        return node


def _patch(found: _Found, cwd: str) -> Patch | None:
    """The line of ``found`` with the family's repair applied; None when one line cannot carry it."""
    if found.site is None or found.family not in _FIXES:
        return None
    code_object, line = found.site
    filename = code_object.co_filename
    lines = linecache.getlines(filename)
    if not lines:
        return None
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return None
    statement = statement_at(tree, line)
    text = single_line(statement, lines) if statement is not None else None
    if text is None:
        return None
    repair = _Repair(found, "torch")
    changed = repair.visit(ast.parse(text).body[0])
    if not repair.done:
        return None
    return Patch(resolve(found.site, cwd).file, line, ast.unparse(ast.fix_missing_locations(changed)))


_LR_DIVISORS = (10, 100, 1000)  # the learning rates a run tries, largest first


def _source(found: _Found) -> tuple[ast.Module, list[str], int] | None:
    """The syntax tree and lines of the file where ``found`` ran, and its line."""
    if found.site is None:
        return None
    code_object, line = found.site
    lines = linecache.getlines(code_object.co_filename)
    try:
        return ast.parse("".join(lines)), lines, line
    except (SyntaxError, ValueError):
        return None


def _candidates(origin: _Found, cwd: str) -> list[Patch]:
    """Changed lines that may fix a value that overflowed its dtype, to be run before they are proposed."""
    parsed = _source(origin)
    if parsed is None or origin.site is None:
        return []
    tree, lines, line = parsed
    file = resolve(origin.site, cwd).file
    if origin.dtype in (torch.float16, torch.bfloat16):
        patch = _in_float32(tree, lines, line, file)
        return [patch] if patch is not None else []
    if origin.family in ("add", "sub", "mul", "matmul", "linear", "mse_loss", "pow"):
        return _lower_learning_rate(tree, lines, file)
    return []


def _in_float32(tree: ast.Module, lines: list[str], line: int, file: str) -> Patch | None:
    """``name = a OP b`` as ``a.float() OP b.float()``, inside ``autocast(..., enabled=False)`` when an
    autocast block holds it (autocast would cast the float32 inputs back)."""
    statement = statement_at(tree, line)
    if not isinstance(statement, ast.Assign) or not isinstance(statement.value, ast.BinOp):
        return None
    if single_line(statement, lines) is None:
        return None
    value = statement.value
    value.left, value.right = _method(value.left, "float"), _method(value.right, "float")
    code = ast.unparse(statement)
    blocks = [node for node in ast.walk(tree) if isinstance(node, ast.With)
              and node.lineno < line <= (node.end_lineno or 0)]
    calls = [item.context_expr for block in blocks for item in block.items if isinstance(item.context_expr, ast.Call)]
    autocast = next((call for call in calls if ast.unparse(call.func).endswith("autocast") and call.args), None)
    if autocast is not None:
        function = ast.unparse(autocast.func)
        device = ast.get_source_segment("".join(lines), autocast.args[0]) or ast.unparse(autocast.args[0])
        code = f"with {function}({device}, enabled=False): {code}"
    return Patch(file, line, code)


def _lower_learning_rate(tree: ast.Module, lines: list[str], file: str) -> list[Patch]:
    """The one call that sets ``lr=NUMBER`` (the optimiser's), with the learning rate 10, 100 and 1000 times lower."""
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and any(keyword.arg == "lr" and isinstance(keyword.value, ast.Constant)
                     and isinstance(keyword.value.value, (int, float)) for keyword in node.keywords)]
    if len(calls) != 1:
        return []
    statement = statement_at(tree, calls[0].lineno)
    if statement is None or single_line(statement, lines) is None:
        return []
    keyword = next(keyword for keyword in calls[0].keywords if keyword.arg == "lr")
    rate = keyword.value.value
    if rate <= 0:
        return []
    patches = []
    for divisor in _LR_DIVISORS:
        keyword.value = ast.Constant(float(f"{rate / divisor:.3g}"))
        patches.append(Patch(file, statement.lineno, ast.unparse(statement)))
    return patches
