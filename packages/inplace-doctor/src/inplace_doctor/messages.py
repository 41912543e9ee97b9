"""PyTorch's own error text for a modified saved tensor, and the exception that carries a report."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import TypeVar

import torch

from .report import GraphReport, Report

VERSION_ERROR = "one of the variables needed for gradient computation has been modified by an inplace operation"
ANOMALY_HINT = (
    " Hint: the backtrace further above shows the operation that failed to compute its gradient. "
    "The variable in question was changed in there or anywhere later. Good luck!"
)


class DoctorError(RuntimeError):
    """An autograd error PyTorch raised, re-raised with the doctor's diagnosis attached.

    It is a ``RuntimeError`` with PyTorch's exact message, so existing ``except`` clauses and
    message matching keep working; ``reports`` holds the report objects.
    """

    def __init__(self, message: str, reports: list[Report] | list[GraphReport]) -> None:
        super().__init__(message)
        self.reports = reports

    @classmethod
    def explaining(cls: type[ExplainedError], error: BaseException,
                   diagnose: Callable[[], GraphReport | None]) -> ExplainedError:
        """PyTorch's ``error``, unchanged in message, carrying ``diagnose()``'s report (also as a note on
        the traceback). A diagnosis that fails must not replace PyTorch's error: it then carries none."""
        try:
            report = diagnose()
        except Exception:  # noqa: BLE001 - see above
            report = None
        explained = cls(str(error), [report] if report else [])
        if report is not None and hasattr(explained, "add_note"):
            explained.add_note("\n" + report.format())
        return explained


ExplainedError = TypeVar("ExplainedError", bound=DoctorError)


class SavedTensorModifiedError(DoctorError):
    """PyTorch's in-place modification error, raised with the doctor's diagnosis attached."""


class InplaceWarning(UserWarning):
    """Warning category for modifications found by :func:`check_step`."""


def is_inplace_error(error: BaseException) -> bool:
    """True for PyTorch's "modified by an inplace operation" error, with or without the doctor."""
    return isinstance(error, RuntimeError) and VERSION_ERROR in str(error)


# Threads the doctor starts to read PyTorch's own behaviour; never watched.
PROBE_THREAD_PREFIX = "inplace-doctor-probe"
_HINTS: dict[bool, str] = {}


_TYPE_NAMES: dict[tuple[object, str], str] = {}
_TYPE_NAME = re.compile(r"inplace operation: \[(\S+) \[")


def _run_probe(probe: Callable[[], None]) -> None:
    """Run ``probe`` on a fresh thread, where no hook or dispatch mode of the doctor is installed."""
    thread = threading.Thread(target=probe, name=PROBE_THREAD_PREFIX)
    thread.start()
    thread.join()


def pytorch_type_name(tensor: torch.Tensor) -> str:
    """The tensor type as PyTorch's version error prints it, read from PyTorch once per dtype and device.

    It is ``torch.FloatTensor`` or ``torch.cuda.HalfTensor`` for most types, but ``CPUBFloat16Type``
    for bfloat16 on CPU, so rather than guess, a tiny program hits the real error once.
    """
    key = (tensor.dtype, str(tensor.device))
    name = _TYPE_NAMES.get(key)
    if name is None:
        found: list[str] = []

        def probe() -> None:
            x = torch.zeros(1, device=tensor.device, requires_grad=True)
            saved = torch.zeros(1, dtype=tensor.dtype, device=tensor.device)
            y = x * saved  # multiplication saves its other operand to compute x's gradient
            saved.zero_()
            try:
                torch.autograd.grad(y, x, torch.ones_like(y))
            except RuntimeError as exc:
                found.append(str(exc))

        try:
            _run_probe(probe)
        except RuntimeError:
            found.clear()
        match = _TYPE_NAME.search(found[0]) if found else None
        name = _TYPE_NAMES[key] = match.group(1) if match else tensor.type()
    return name


def pytorch_hint() -> str:
    """The hint sentence PyTorch appends to the error, read from PyTorch itself once.

    The probe runs in a fresh thread because hooks and dispatch modes are thread-local, so it
    sees PyTorch's own check rather than ours.
    """
    if torch.is_anomaly_enabled():
        return ANOMALY_HINT
    if False not in _HINTS:
        found: list[str] = []

        def probe() -> None:
            x = torch.ones(1, requires_grad=True)
            y = x.sigmoid()
            y.add_(1)
            try:
                y.sum().backward()
            except RuntimeError as exc:
                found.append(str(exc))

        _run_probe(probe)
        message = found[0] if found else ""
        cut = message.find(" instead.")
        _HINTS[False] = message[cut + len(" instead.") :] if cut >= 0 else ""
    return _HINTS[False]
