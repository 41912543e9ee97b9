"""Silent cuts: a parameter the optimizer updates, whose module ran, that got no gradient.

No error comes: the loss keeps a graph through other parameters, and ``optimizer.step()`` skips the
ones whose ``.grad`` is None (a backbone run under a ``@torch.no_grad()`` helper, CLIP's
``logit_scale`` read through ``.item()``). Under the doctor a global forward pre-hook notes which
modules ran (and whether gradients were on), and a global optimizer step pre-hook looks, at each
step, for parameters that require grad, have no ``.grad`` and belong to a module that ran since
that optimizer's last step. Each is reported once, with the line that cut it where the source shows
it: a statement of the function that called ``step()`` that ran the module under ``no_grad``,
through a decorated helper, or ``.detach()``/``.data``/``.item()`` of its output; or a line of the
module's own class that reads the parameter that way.

Parameters frozen on purpose (``requires_grad=False``) are never reported; others are silenced by
name (``watch(ignore_unused=["logit_scale", "aux.*"])``, the ``INPLACE_DOCTOR_IGNORE_UNUSED``
environment variable, ``--ignore-unused NAME``), matched with ``fnmatch`` against the parameter's
dotted name in the outermost module that ran.
"""

from __future__ import annotations

import ast
import fnmatch
import inspect
import linecache
import os
import sys
import warnings
from collections.abc import Iterable
from types import FrameType
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .frames import display_path, is_user_code
from .graph_cut import (
    _LABELS,
    _LEAVING,
    _REASONS,
    DATA,
    DECORATOR,
    DETACH,
    FROZEN,
    ROUND_TRIP,
    _decorator_sites,
    _patch,
    _reason,
    _Reconnect,
)
from .messages import InplaceWarning
from .report import GraphReport, Patch, Site
from .source import Binding, dotted_name, single_line, statement_at

SILENT_CUT = "silent_cut"
IGNORE_ENV = "INPLACE_DOCTOR_IGNORE_UNUSED"


class SilentCutWarning(InplaceWarning):
    """A parameter the optimizer updates got no gradient although its module ran."""


def ignored_names(names: Iterable[str] = ()) -> list[str]:
    """The patterns given in code plus those of ``INPLACE_DOCTOR_IGNORE_UNUSED`` (comma-separated)."""
    from_env = [n.strip() for n in os.environ.get(IGNORE_ENV, "").split(",") if n.strip()]
    return [*names, *from_env]


class SilentCuts:
    """The hooks that find parameters left without gradient; ``reports`` holds what was found."""

    def __init__(self, cwd: str, ignore: Iterable[str] = (), warn: bool = True) -> None:
        self.cwd = cwd
        self.ignore = ignored_names(ignore)
        self.warn = warn
        self.reports: list[GraphReport] = []
        self._ran: dict[int, tuple[torch.nn.Module, bool, int]] = {}  # module id -> (module, grad on, step)
        self._steps = 0
        self._last_step: dict[int, int] = {}  # optimizer id -> the step count after its last step
        self._reported: set[int] = set()
        self._handles: list[Any] = []

    def start(self) -> None:
        self._handles = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._module_ran),
            register_optimizer_step_pre_hook(self._before_step),
        ]

    def stop(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _module_ran(self, module: torch.nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling():  # traced by torch.compile: nothing to note, and no state to trace
            return
        self._ran[id(module)] = (module, torch.is_grad_enabled(), self._steps)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if torch.compiler.is_compiling():
            return
        since = self._last_step.get(id(optimizer), 0)
        self._steps += 1
        self._last_step[id(optimizer)] = self._steps
        missing = [p for group in optimizer.param_groups for p in group["params"]
                   if p.grad is None and p.requires_grad and id(p) not in self._reported]
        if not missing:
            return
        owners = {id(p): grad_on for module, grad_on, step in list(self._ran.values()) if step >= since
                  for p in module._parameters.values() if p is not None}
        by_root: dict[int, tuple[torch.nn.Module | None, list[tuple[str, torch.Tensor]], bool]] = {}
        for parameter in missing:
            if id(parameter) not in owners:
                continue
            self._reported.add(id(parameter))
            name, root = self._name(parameter)
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.ignore):
                continue
            _, named, grad_on = by_root.setdefault(id(root), (root, [], True))
            named.append((name, parameter))
            by_root[id(root)] = (root, named, grad_on and owners[id(parameter)])
        frame = _stepping_frame()
        for root, named, grad_on in by_root.values():
            report = self._report(named, root, frame, grad_on)
            if report is None:
                continue
            self.reports.append(report)
            if self.warn:
                warnings.warn(report.format(), SilentCutWarning, stacklevel=3)

    def _name(self, parameter: torch.nn.Parameter) -> tuple[str, torch.nn.Module | None]:
        """The parameter's dotted name in the outermost module that ran and holds it, and that module."""
        best: tuple[str, torch.nn.Module | None] = ("", None)
        for module, _, _ in self._ran.values():
            for name, candidate in module.named_parameters():
                if candidate is parameter and (best[1] is None or name.count(".") > best[0].count(".")):
                    best = (name, module)
        return best

    def _report(self, named: list[tuple[str, torch.Tensor]], root: torch.nn.Module | None,
                frame: FrameType | None, grad_on: bool) -> GraphReport | None:
        """One report for the parameters of one module; None for a module that only ran with gradients off
        where no statement before ``step()`` shows it feeding the step (an evaluation after it)."""
        owner = type(root).__name__ if root is not None else "a module"
        shown = ", ".join(f"`{n}` {list(p.shape)}" for n, p in named[:4]) + (
            f" and {len(named) - 4} more" if len(named) > 4 else "")
        plural = "s" if len(named) > 1 else ""
        message = (f"parameter{plural} {shown} of {owner} got no gradient: the optimizer updates "
                   f"{'them' if plural else 'it'} and {'their' if plural else 'its'} module ran, but `.grad` is None "
                   "at `step()`")
        name, parameter = named[0]
        sites: list[tuple[str, Site]] = []
        patches: list[Patch] = []
        reasons: list[str] = []
        cuts = _cut_sites(parameter, root, frame, self.cwd, grad_on)
        if not grad_on and not cuts:
            return None
        for site, patch, reason in cuts:
            if ("cut at", site) not in sites:
                sites.append(("cut at", site))
                reasons.append(f"{site.where()} {_REASONS.get(reason, 'cut the graph')}")
                patches += [patch] if patch is not None and patch not in patches else []
        if frame is not None:
            file = display_path(frame.f_code.co_filename, self.cwd)
            code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            sites.append(("stepped at", Site("step()", file, frame.f_lineno, code)))
        silence = (f"if it is frozen on purpose, create it with `requires_grad=False` (or leave it out of the "
                   f"optimizer), or silence it with `watch(ignore_unused=[{name!r}])`, `--ignore-unused {name}` or "
                   f"{IGNORE_ENV}={name}")
        if reasons:
            change = "".join(f"; change {p.file}:{p.line} to `{p.code}`" for p in patches)
            fix = f"no gradient reaches `{name}`: " + "; ".join(reasons) + change + "; " + silence
        else:
            fix = (f"no gradient reaches `{name}`: its module ran, but the loss does not depend on it (an output "
                   "detached, read through `.item()` or `.data`, or under `no_grad`, or a branch the loss does "
                   "not use); " + silence)
        return GraphReport(SILENT_CUT, message, sites, fix, patches, severity="warning")


def _stepping_frame() -> FrameType | None:
    """The user frame that called ``optimizer.step()``."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and not is_user_code(frame.f_code):
        frame = frame.f_back
    return frame


def _holds(value: object, parameter: torch.Tensor) -> bool:
    return isinstance(value, torch.nn.Module) and any(p is parameter for p in value.parameters())


def _cut_sites(parameter: torch.Tensor, root: torch.nn.Module | None, frame: FrameType | None,
               cwd: str, grad_on: bool) -> list[tuple[Site, Patch | None, str]]:
    """Lines that cut the parameter off: in the stepping function, then in its module's class."""
    found = _in_stepping_function(parameter, frame, cwd, grad_on) if frame is not None else []
    return found or (_in_module_source(parameter, root, cwd) if grad_on else [])


def _in_stepping_function(parameter: torch.Tensor, frame: FrameType, cwd: str,
                          grad_on: bool) -> list[tuple[Site, Patch | None, str]]:
    """Statements of the function that called ``step()`` whose call of the parameter's module lost the graph.

    A module that ran only with gradients off counts through an assignment written before ``step()``
    (the order of a loop's body), so an evaluation under ``no_grad`` after the step is none. The names a
    statement that called the module bound, and those bound from them in turn, are followed too, so a
    cut on a line of its own (``hidden = hidden.detach()`` after ``_, hidden = encoder(x)``) is found.
    """
    filename = frame.f_code.co_filename
    lines = linecache.getlines(filename, frame.f_globals)
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return []
    scope = statement_at(tree, frame.f_code.co_firstlineno) if frame.f_code.co_name != "<module>" else tree
    file = display_path(filename, cwd)
    found: list[tuple[Site, Patch | None, str]] = []
    statements = sorted((node for node in ast.walk(scope or tree)
                         if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr))
                         and node.value is not None), key=lambda node: node.lineno)
    derived: set[str] = set()  # names bound, with their graph, from the module's output
    for statement in statements:
        if not grad_on and (isinstance(statement, ast.Expr) or statement.lineno >= frame.f_lineno):
            continue
        names = [dotted_name(n) for n in ast.walk(statement.value) if isinstance(n, (ast.Name, ast.Attribute))]
        values = [_frame_value(frame, n) for n in names if n is not None]
        calls_module = any(_holds(v, parameter) for v in values)
        if not calls_module and not derived & set(names):
            continue
        binding = Binding(statement, ast.unparse(statement.targets[0]) if isinstance(statement, ast.Assign)
                          else "value", statement.value)
        reason = _reason(binding, tree, frame, None)
        targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
        bound = {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}
        if reason is None:
            derived |= bound
        # Downstream, only a cut that rebinds the name it cut (`hidden = hidden.detach()`) leaves no use of the
        # graph; a detached copy beside the name (`critic(logits.detach())`) may be one use among others.
        if reason is None or reason == FROZEN or (not calls_module and not (derived & bound & set(names))):
            continue
        if reason == DECORATOR:
            found += [(site, patch, reason) for site, patch in _decorator_sites(binding, frame, cwd)]
            continue
        line = statement.lineno
        code = _patch(binding, reason, lines, frame)
        site = Site(_LABELS[reason], file, line, lines[line - 1].strip())
        found.append((site, Patch(file, line, code) if code is not None else None, reason))
    return found


def _frame_value(frame: FrameType, name: str) -> object:
    head, *rest = name.split(".")
    value = frame.f_locals.get(head, frame.f_globals.get(head))
    for attr in rest:
        value = getattr(value, attr, None) if not isinstance(value, type) else None
    return value


def _in_module_source(parameter: torch.Tensor, root: torch.nn.Module | None,
                      cwd: str) -> list[tuple[Site, Patch | None, str]]:
    """Lines of the owning module's class that read ``self.NAME`` through ``.detach()``, ``.data`` or ``.item()``."""
    owners = [m for m in (root.modules() if root is not None else []) if any(p is parameter for p in
                                                                              m._parameters.values())]
    found: list[tuple[Site, Patch | None, str]] = []
    for owner in owners:
        attribute = next(n for n, p in owner._parameters.items() if p is parameter)
        try:
            lines, start = inspect.getsourcelines(type(owner))
            filename = inspect.getsourcefile(type(owner)) or ""
        except (OSError, TypeError):
            continue
        tree = ast.parse("".join(line[len(lines[0]) - len(lines[0].lstrip()):] for line in lines))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)):
                continue
            value = node.value
            reads = {dotted_name(n) for n in ast.walk(value)} if value is not None else set()
            if f"self.{attribute}" not in reads:
                continue
            methods = {c.func.attr for c in ast.walk(value) if isinstance(c, ast.Call)
                       and isinstance(c.func, ast.Attribute)}
            reason = (DETACH if "detach" in methods else DATA if "data" in {n.attr for n in ast.walk(value)
                      if isinstance(n, ast.Attribute)} else ROUND_TRIP if methods & _LEAVING else None)
            if reason is None:
                continue
            line = start + node.lineno - 1
            text = linecache.getline(filename, line).strip()
            patch = None
            if node.lineno == node.end_lineno and not isinstance(node, ast.Return):
                original = ast.unparse(node)
                changed = ast.unparse(ast.fix_missing_locations(_Reconnect(None).visit(node)))
                if changed != original and single_line(ast.parse(text).body[0], [text]) is not None:
                    patch = Patch(display_path(filename, cwd), line, changed)
            found.append((Site(_LABELS[reason], display_path(filename, cwd), line, text), patch, reason))
    return found
