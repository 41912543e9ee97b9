"""Static (AST) search for in-place hazards in ``forward``, ``__call__`` and loss code.

It flags what the runtime tracker would catch only when it fails: ``inplace=True``,
augmented assignment on tensors, ``foo_()`` methods, slice/mask assignment and ``.data``
writes. Names that are plainly not tensors in the same function (initialised from
literals, ``len()``, ``range()`` loop indices, ``.item()``...) are left alone.
A line ending in ``# doctor: ok`` is skipped.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .fixes import AUGMENTED, DATA_WRITE, HINTS, INPLACE_FLAG, INPLACE_METHOD, SLICE_ASSIGN
from .frames import display_path

SUPPRESS = "# doctor: ok"
_SKIP_DIRS = {"__pycache__", ".git", ".venv", "venv", "build", "dist", "node_modules"}
# Methods ending in "_" that flip flags or share memory rather than overwrite values.
_HARMLESS_METHODS = {"requires_grad_", "share_memory_", "retain_grad_", "pin_memory_"}
_SCALAR_CALLS = {"len", "int", "float", "str", "bool", "range", "round", "list", "dict", "tuple", "set", "enumerate"}
_SCALAR_METHODS = {"item", "tolist", "numel", "dim", "size", "nelement", "element_size", "get", "keys", "items"}
_SCALAR_TYPES = {"int", "float", "str", "bool", "list", "dict", "tuple", "set"}
_TORCH_ROOTS = {"nn", "F", "torch", "functional"}


@dataclass(frozen=True)
class Finding:
    """One static hazard: where, what kind, and the fix hint."""

    path: str
    line: int
    kind: str
    code: str
    hint: str

    def format(self) -> str:
        """``path:LINE: kind: hint`` followed by the offending source line."""
        return f"{self.path}:{self.line}: {self.kind.replace('_', ' ')}: {self.hint}\n    {self.code}"

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly form."""
        return {"file": self.path, "line": self.line, "kind": self.kind, "code": self.code, "fix": self.hint}


def _is_scope(func: ast.FunctionDef | ast.AsyncFunctionDef, class_name: str | None) -> bool:
    """Functions whose tensors feed autograd: forward, __call__, loss functions and loss classes."""
    if func.name in ("forward", "__call__") or "loss" in func.name.lower():
        return True
    return class_name is not None and "loss" in class_name.lower()


def _root_name(node: ast.expr) -> str | None:
    """``a`` for ``a``, ``a.b.c``, ``a[0].b``; None for calls and other expressions."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_data_access(node: ast.expr) -> bool:
    """True when the expression goes through ``.data`` (``p.data``, ``p.data[0]``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and node.attr == "data":
            return True
        node = node.value
    return False


class _ScalarNames:
    """Which local names of one function are certainly not tensors."""

    def __init__(self, func: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._values: dict[str, list[ast.expr | None]] = {}
        self._collect_params(func.args)
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    self._bind(target, node.value)
            elif isinstance(node, ast.AnnAssign):
                self._bind(node.target, node.value if node.value is not None else node.annotation)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                self._bind_loop(node.target, node.iter)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        self._bind(item.optional_vars, None)
        self.scalars = self._solve()

    def _collect_params(self, args: ast.arguments) -> None:
        positional = args.posonlyargs + args.args
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        pairs = list(zip(positional, defaults)) + list(zip(args.kwonlyargs, args.kw_defaults))
        for arg, default in pairs:
            annotation = arg.annotation
            if isinstance(annotation, ast.Name) and annotation.id in _SCALAR_TYPES:
                self._values.setdefault(arg.arg, []).append(ast.Constant(0))
            elif annotation is None and isinstance(default, ast.Constant):
                self._values.setdefault(arg.arg, []).append(default)
            else:
                self._values.setdefault(arg.arg, []).append(None)

    def _bind(self, target: ast.expr, value: ast.expr | None) -> None:
        if isinstance(target, ast.Name):
            self._values.setdefault(target.id, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._bind(element, None)

    def _bind_loop(self, target: ast.expr, iterable: ast.expr) -> None:
        call = iterable if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) else None
        if call is not None and call.func.id == "range":  # type: ignore[union-attr]
            self._bind(target, ast.Constant(0))
        elif call is not None and call.func.id == "enumerate" and isinstance(target, ast.Tuple) and target.elts:  # type: ignore[union-attr]
            self._bind(target.elts[0], ast.Constant(0))
            for element in target.elts[1:]:
                self._bind(element, None)
        else:
            self._bind(target, None)

    def _solve(self) -> set[str]:
        """Fixed point: a name is scalar when every value bound to it is scalar."""
        scalars: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, values in self._values.items():
                if name not in scalars and all(v is not None and _is_scalar(v, scalars) for v in values):
                    scalars.add(name)
                    changed = True
        return scalars


def _is_scalar(node: ast.expr, scalars: set[str]) -> bool:
    """True when ``node`` evaluates to a plain Python value, never a tensor."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    if isinstance(node, (ast.JoinedStr, ast.GeneratorExp)):
        return True
    if isinstance(node, ast.Name):
        return node.id in scalars
    if isinstance(node, ast.UnaryOp):
        return _is_scalar(node.operand, scalars)
    if isinstance(node, ast.BinOp):
        return _is_scalar(node.left, scalars) and _is_scalar(node.right, scalars)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id in _SCALAR_CALLS
        if isinstance(func, ast.Attribute):
            return func.attr in _SCALAR_METHODS
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
        return node.value.attr == "shape"
    if isinstance(node, ast.Attribute):
        return node.attr in ("shape", "ndim", "dtype", "device")
    return False


class _FileLinter(ast.NodeVisitor):
    """Walks one module, tracking the enclosing class and lint scope."""

    def __init__(self, path: str, lines: list[str]) -> None:
        self.path = path
        self.lines = lines
        self.findings: list[Finding] = []
        self._class: str | None = None
        self._scalars: list[set[str]] = []

    def _add(self, node: ast.AST, kind: str, hint: str | None = None) -> None:
        line = getattr(node, "lineno", 0)
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if text.rstrip().endswith(SUPPRESS):
            return
        self.findings.append(Finding(self.path, line, kind, text.strip(), hint or HINTS[kind]))

    @property
    def _in_scope(self) -> bool:
        return bool(self._scalars)

    def _is_scalar_name(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and any(node.id in scope for scope in self._scalars)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        outer, self._class = self._class, node.name
        self.generic_visit(node)
        self._class = outer

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        entered = self._in_scope or _is_scope(node, self._class)
        outer_class = self._class
        self._class = None  # nested functions are not methods
        if entered:
            self._scalars.append(_ScalarNames(node).scalars)
        self.generic_visit(node)
        if entered:
            self._scalars.pop()
        self._class = outer_class

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        for keyword in node.keywords:
            if keyword.arg == "inplace" and isinstance(keyword.value, ast.Constant) and keyword.value.value is True:
                if self._in_scope or _looks_like_torch(node.func):
                    self._add(node, INPLACE_FLAG)
        func = node.func
        if self._in_scope and isinstance(func, ast.Attribute) and _is_inplace_method(func.attr):
            if _is_data_access(func.value):
                self._add(node, DATA_WRITE)
            elif not self._is_scalar_name(func.value):
                name = func.attr[:-1]
                self._add(node, INPLACE_METHOD,
                          f"`.{func.attr}()` works in place; use the out-of-place `y = y.{name}(...)`")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if self._in_scope:
            target = node.target
            if _is_data_access(target):
                self._add(node, DATA_WRITE)
            elif isinstance(target, ast.Subscript):
                if not self._is_scalar_name(_base(target)):
                    self._add(node, SLICE_ASSIGN)
            elif isinstance(target, ast.Attribute):
                if not isinstance(node.value, ast.Constant):
                    self._add(node, AUGMENTED)
            elif not self._is_scalar_name(target):
                self._add(node, AUGMENTED)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if self._in_scope:
            for target in node.targets:
                self._check_store(target, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if self._in_scope and node.value is not None:
            self._check_store(node.target, node)
        self.generic_visit(node)

    def _check_store(self, target: ast.expr, node: ast.AST) -> None:
        if isinstance(target, ast.Attribute) and target.attr == "data" or _is_data_access(target):
            self._add(node, DATA_WRITE)
        elif isinstance(target, ast.Subscript) and not self._is_scalar_name(_base(target)):
            self._add(node, SLICE_ASSIGN)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._check_store(element, node)


def _base(node: ast.Subscript) -> ast.expr:
    """The container being indexed: ``x`` for ``x[0][1]``."""
    value: ast.expr = node
    while isinstance(value, ast.Subscript):
        value = value.value
    return value


def _is_inplace_method(name: str) -> bool:
    """``add_``/``clamp_``-style names: trailing underscore, not private, not dunder."""
    return name.endswith("_") and not name.startswith("_") and name not in _HARMLESS_METHODS


def _looks_like_torch(func: ast.expr) -> bool:
    """``nn.ReLU``, ``ReLU``, ``F.relu``, ``torch.nn.functional.dropout``: calls ``inplace`` means tensors for."""
    if isinstance(func, ast.Name):
        return func.id[:1].isupper()
    if isinstance(func, ast.Attribute):
        root = _root_name(func)
        return root in _TORCH_ROOTS or func.attr[:1].isupper()
    return False


def lint_source(source: str, path: str) -> list[Finding]:
    """Lint one module's source text; ``path`` is only used in the findings."""
    tree = ast.parse(source, filename=path)
    linter = _FileLinter(path, source.splitlines())
    linter.visit(tree)
    return sorted(set(linter.findings), key=lambda f: (f.line, f.kind))


def _python_files(paths: Iterable[str]) -> Iterator[str]:
    """Every ``.py`` file named or below the named folders, in a stable order."""
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
                yield from (os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))
        else:
            yield path


def lint_paths(paths: Iterable[str], cwd: str | None = None) -> list[Finding]:
    """Lint files and folders; findings carry paths relative to ``cwd`` when below it."""
    base = cwd or os.getcwd()
    findings: list[Finding] = []
    for filename in _python_files(paths):
        with open(filename, encoding="utf-8") as handle:
            source = handle.read()
        findings.extend(lint_source(source, display_path(filename, base)))
    return findings
