"""Object detection: boxes with a class and a confidence (YOLOv5's anchor-based head)."""

from __future__ import annotations

from ...task import Task
from .export import DetectExport


class DetectTask(DetectExport, Task):
    """Detection's answers to the shared code."""

    name = "detect"


TASK = DetectTask()
