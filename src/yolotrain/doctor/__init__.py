"""The in-place autograd doctor, from the stand-alone ``inplace-doctor`` distribution.

Re-exported here so that ``yolotrain.doctor`` and ``yolotrain doctor`` keep working; see
``docs/doctor.md``.
"""

from inplace_doctor import (
    DoctorError,
    GraphCutError,
    GraphFreedError,
    GraphReport,
    InplaceWarning,
    InplaceWriteError,
    LintFinding,
    NanOriginError,
    Patch,
    Report,
    SavedTensorModifiedError,
    Site,
    TensorInfo,
    Tracker,
    check_step,
    is_graph_cut_error,
    is_graph_freed_error,
    is_inplace_error,
    lint_paths,
    run_with_report,
    watch,
)

__all__ = [
    "DoctorError",
    "GraphCutError",
    "GraphFreedError",
    "GraphReport",
    "InplaceWarning",
    "InplaceWriteError",
    "LintFinding",
    "NanOriginError",
    "Patch",
    "Report",
    "SavedTensorModifiedError",
    "Site",
    "TensorInfo",
    "Tracker",
    "check_step",
    "is_graph_cut_error",
    "is_graph_freed_error",
    "is_inplace_error",
    "lint_paths",
    "run_with_report",
    "watch",
]
