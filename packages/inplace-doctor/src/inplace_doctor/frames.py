"""Cheap call-site capture and lazy resolution to ``path:LINE`` plus source text.

Capturing a site happens on hot paths (every tensor saved for backward), so it only
walks ``sys._getframe`` and keeps ``(code object, line number)``; file names are
classified once per code object and source text is read only when a report is shown.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import NamedTuple

import torch


class SourcePlace(NamedTuple):
    """Stands in for a code object when a site is known only by file name (compiled graphs)."""

    co_filename: str


RawSite = tuple[CodeType | SourcePlace, int]


def _library_roots() -> tuple[str, ...]:
    """Directories whose frames are never the user's: torch, this package, stdlib, installed packages."""
    roots = {
        os.path.dirname(torch.__file__),
        os.path.dirname(os.path.abspath(__file__)),
    }
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            roots.add(paths[key])
    for entry in sys.path:
        if entry.endswith(("site-packages", "dist-packages")):
            roots.add(entry)
    return tuple(os.path.realpath(r) + os.sep for r in roots)


_LIBRARY_ROOTS = _library_roots()
_DOCTOR_ROOT = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TORCH_OPTIM_ROOT = os.path.join(os.path.dirname(torch.__file__), "optim") + os.sep
# Classification per code object; cleared when full, since programs that exec generated code
# create code objects without end.
_USER_CACHE: dict[CodeType, bool] = {}
MAX_CACHED_CODES = 16384


def is_user_code(code: CodeType) -> bool:
    """True when ``code`` belongs to the program being debugged (memoised per code object)."""
    known = _USER_CACHE.get(code)
    if known is None:
        name = code.co_filename
        if name.startswith("<frozen") or name.startswith("<built-in"):
            known = False
        elif name.startswith("<"):
            known = True
        else:
            known = not os.path.realpath(name).startswith(_LIBRARY_ROOTS)
        if len(_USER_CACHE) >= MAX_CACHED_CODES:
            _USER_CACHE.clear()
        _USER_CACHE[code] = known
    return known


_FX_PREFIX = "<eval_with_key>"
_FX_SITES: dict[CodeType, dict[int, RawSite | None]] = {}
_STACK_ENTRY = re.compile(r'File "([^"]+)", line (\d+)')


def _fx_site(frame: FrameType) -> RawSite | None:
    """The user's line behind a line of FX-generated code (``torch.compile``'s graphs).

    Each generated line runs one graph node, whose ``stack_trace`` metadata holds the traceback
    of the user code it was traced from; its innermost entry is the line to report.
    """
    code, line = frame.f_code, frame.f_lineno
    per_line = _FX_SITES.get(code)
    if per_line is None:
        if len(_FX_SITES) >= MAX_CACHED_CODES:
            _FX_SITES.clear()
        per_line = _FX_SITES[code] = {}
    if line in per_line:
        return per_line[line]
    site: RawSite | None = None
    module = frame.f_locals.get("self")
    lineno_map = getattr(module, "_lineno_map", None)
    graph = getattr(module, "graph", None)
    if lineno_map and graph is not None:
        index = lineno_map.get(line - code.co_firstlineno)
        if index is not None:
            nodes = list(graph.nodes)
            trace = nodes[index].meta.get("stack_trace") if index < len(nodes) else None
            entries = _STACK_ENTRY.findall(trace or "")
            if entries:
                filename, number = entries[-1]
                site = SourcePlace(filename), int(number)
    per_line[line] = site
    return site


def _site_of(frame: FrameType) -> RawSite | None:
    """(code, line) of a user frame; for generated graph code, the user line it came from."""
    code = frame.f_code
    if code.co_filename.startswith(_FX_PREFIX):
        return _fx_site(frame)
    return code, frame.f_lineno


def user_site(depth: int) -> RawSite | None:
    """Innermost user frame at or above ``depth`` frames from the caller, as (code, lineno).

    Falls back to the innermost frame outside this package when no frame qualifies
    (e.g. code that lives entirely in site-packages), so a report always has a location.
    """
    frame: FrameType | None = sys._getframe(depth + 1)
    fallback: RawSite | None = None
    while frame is not None:
        code = frame.f_code
        if is_user_code(code):
            site = _site_of(frame)
            if site is not None:
                return site
        if fallback is None and not code.co_filename.startswith(_DOCTOR_ROOT):
            fallback = code, frame.f_lineno
        frame = frame.f_back
    return fallback


@dataclass(frozen=True)
class CallContext:
    """What the library frames between an operator and the user's line tell about it."""

    site: RawSite | None
    optimizer: str | None  # class name when the op ran inside ``torch.optim`` code
    inplace_module: str | None  # e.g. "ReLU" when an ``inplace=True`` module ran it
    inplace_functional: str | None  # e.g. "relu" when ``F.relu(..., inplace=True)`` ran it
    autograd_function: bool  # the user frame is a custom ``autograd.Function.forward``


def call_context(depth: int) -> CallContext:
    """Describe the call that issued an in-place operator (cold path: only on real hits)."""
    frame: FrameType | None = sys._getframe(depth + 1)
    optimizer = module = functional = None
    while frame is not None:
        code = frame.f_code
        site = _site_of(frame) if is_user_code(code) else None
        if site is not None:
            local_vars = frame.f_locals
            is_function = code.co_name == "forward" and _is_function_ctx(local_vars.get("ctx"))
            return CallContext(site, optimizer, module, functional, is_function)
        owner = frame.f_locals.get("self")
        if optimizer is None and code.co_filename.startswith(_TORCH_OPTIM_ROOT):
            if isinstance(owner, torch.optim.Optimizer):
                optimizer = type(owner).__name__
        if module is None and isinstance(owner, torch.nn.Module) and getattr(owner, "inplace", False):
            module = type(owner).__name__
        if functional is None and frame.f_locals.get("inplace") is True:
            functional = code.co_name
        frame = frame.f_back
    return CallContext(user_site(depth + 1), optimizer, module, functional, False)


def _is_function_ctx(ctx: object) -> bool:
    """True for the ``ctx`` object autograd passes to a custom Function's forward."""
    return isinstance(ctx, torch.autograd.function.FunctionCtx)


@dataclass(frozen=True)
class Location:
    """A resolved site: display path, line number and the stripped source line."""

    file: str
    line: int
    code: str


def display_path(filename: str, cwd: str) -> str:
    """Path as the user would type it: relative to ``cwd`` when below it, else absolute."""
    if filename.startswith("<"):
        return filename
    absolute = filename if os.path.isabs(filename) else os.path.join(cwd, filename)
    absolute = os.path.normpath(absolute)
    if absolute.startswith(cwd.rstrip(os.sep) + os.sep):
        return os.path.relpath(absolute, cwd)
    return absolute


def resolve(site: RawSite | None, cwd: str) -> Location:
    """Turn a raw site into a :class:`Location`, reading the source line only now."""
    if site is None:
        return Location("<unknown>", 0, "")
    code, line = site
    filename = code.co_filename
    source_file = filename if os.path.isabs(filename) else os.path.join(cwd, filename)
    text = linecache.getline(source_file, line) or linecache.getline(filename, line)
    return Location(display_path(filename, cwd), line, text.strip())
