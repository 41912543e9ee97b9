"""PyTorch's own error text for a modified saved tensor, and the exception that carries a report."""

from __future__ import annotations

import threading

from .report import Report

VERSION_ERROR = "one of the variables needed for gradient computation has been modified by an inplace operation"
ANOMALY_HINT = (
    " Hint: the backtrace further above shows the operation that failed to compute its gradient. "
    "The variable in question was changed in there or anywhere later. Good luck!"
)


class SavedTensorModifiedError(RuntimeError):
    """PyTorch's in-place modification error, raised with the doctor's diagnosis attached.

    It is a ``RuntimeError`` with PyTorch's exact message, so existing ``except`` clauses and
    message matching keep working; ``reports`` holds the :class:`Report` objects.
    """

    def __init__(self, message: str, reports: list[Report]) -> None:
        super().__init__(message)
        self.reports = reports


class InplaceWarning(UserWarning):
    """Warning category for modifications found by :func:`check_step`."""


def is_inplace_error(error: BaseException) -> bool:
    """True for PyTorch's "modified by an inplace operation" error, with or without the doctor."""
    return isinstance(error, RuntimeError) and VERSION_ERROR in str(error)


# Threads the doctor starts to read PyTorch's own behaviour; never watched.
PROBE_THREAD_PREFIX = "inplace-doctor-probe"
_HINTS: dict[bool, str] = {}


def pytorch_hint() -> str:
    """The hint sentence PyTorch appends to the error, read from PyTorch itself once.

    The probe runs in a fresh thread because hooks and dispatch modes are thread-local, so it
    sees PyTorch's own check rather than ours.
    """
    import torch

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

        thread = threading.Thread(target=probe, name=PROBE_THREAD_PREFIX)
        thread.start()
        thread.join()
        message = found[0] if found else ""
        cut = message.find(" instead.")
        _HINTS[False] = message[cut + len(" instead.") :] if cut >= 0 else ""
    return _HINTS[False]
