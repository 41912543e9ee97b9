"""Find the in-place operation behind "modified by an inplace operation" autograd errors.

``watch()`` tracks saved tensors and in-place operators at runtime, ``check_step()`` reports
modifications that do not raise, and ``lint_paths()`` finds the same hazards statically.
"""

from .lint import Finding as LintFinding
from .lint import lint_paths
from .report import Report, Site, TensorInfo
from .tracker import (
    InplaceWarning,
    SavedTensorModifiedError,
    Tracker,
    check_step,
    is_inplace_error,
    run_with_report,
    watch,
)

__all__ = [
    "InplaceWarning",
    "LintFinding",
    "Report",
    "SavedTensorModifiedError",
    "Site",
    "TensorInfo",
    "Tracker",
    "check_step",
    "is_inplace_error",
    "lint_paths",
    "run_with_report",
    "watch",
]
