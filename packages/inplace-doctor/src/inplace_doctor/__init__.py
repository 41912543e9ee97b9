"""Find the lines behind autograd errors whose message points at ``backward()``.

``watch()`` tracks saved tensors and in-place operators at runtime, ``check_step()`` reports
modifications that do not raise, and ``lint_paths()`` finds the same hazards statically.
Under ``watch()`` the "backward through the graph a second time" error also names the
backward that freed the graph and the line that carried a tensor of it into a new one, and an
in-place write PyTorch refuses (into a leaf, or a view of several) names the line that made it;
a backward on a loss without graph names the lines that cut it off.
``%load_ext inplace_doctor`` adds the ``%%doctor`` cell magic to IPython and Jupyter.
"""

from .api import check_step, run_with_report, watch
from .graph_cut import GraphCutError, is_graph_cut_error
from .graph_freed import GraphFreedError, is_graph_freed_error
from .lint import Finding as LintFinding
from .lint import lint_paths
from .messages import DoctorError, InplaceWarning, SavedTensorModifiedError, is_inplace_error
from .mode import Tracker
from .nan_origin import NanOriginError
from .report import GraphReport, Patch, Report, Site, TensorInfo
from .silent_cut import SilentCutWarning
from .view_write import InplaceWriteError


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext inplace_doctor``: register the ``%%doctor`` cell magic."""
    from .ipython import register  # imports IPython, an optional dependency: only when IPython asks

    register(ipython)


__all__ = [
    "DoctorError",
    "GraphCutError",
    "GraphFreedError",
    "GraphReport",
    "InplaceWarning",
    "InplaceWriteError",
    "NanOriginError",
    "LintFinding",
    "Patch",
    "Report",
    "SavedTensorModifiedError",
    "SilentCutWarning",
    "Site",
    "TensorInfo",
    "Tracker",
    "check_step",
    "is_graph_cut_error",
    "is_graph_freed_error",
    "is_inplace_error",
    "lint_paths",
    "load_ipython_extension",
    "run_with_report",
    "watch",
]
