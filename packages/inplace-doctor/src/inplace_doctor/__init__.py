"""Find the in-place operation behind "modified by an inplace operation" autograd errors.

``watch()`` tracks saved tensors and in-place operators at runtime, ``check_step()`` reports
modifications that do not raise, and ``lint_paths()`` finds the same hazards statically.
``%load_ext inplace_doctor`` adds the ``%%doctor`` cell magic to IPython and Jupyter.
"""

from .api import check_step, run_with_report, watch
from .lint import Finding as LintFinding
from .lint import lint_paths
from .messages import InplaceWarning, SavedTensorModifiedError, is_inplace_error
from .mode import Tracker
from .report import Report, Site, TensorInfo


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext inplace_doctor``: register the ``%%doctor`` cell magic."""
    from .ipython import register

    register(ipython)


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
    "load_ipython_extension",
    "run_with_report",
    "watch",
]
