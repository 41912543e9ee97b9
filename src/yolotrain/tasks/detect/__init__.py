"""Object detection: boxes with a class and a confidence (YOLOv5's anchor-based head)."""

from __future__ import annotations

from ...task import Task
from .evaluate import DetectEvaluation
from .export import DetectExport
from .model import DetectModel
from .train import DetectTraining


class DetectTask(DetectTraining, DetectEvaluation, DetectExport, DetectModel, Task):
    """Detection's answers to the shared code."""

    name = "detect"


TASK = DetectTask()
