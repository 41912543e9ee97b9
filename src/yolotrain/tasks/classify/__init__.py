"""Image classification: class scores for a whole image (a YOLOv5 backbone or a torchvision model)."""

from __future__ import annotations

from ...task import Task
from .export import ClassifyExport


class ClassifyTask(ClassifyExport, Task):
    """Classification's answers to the shared code."""

    name = "classify"


TASK = ClassifyTask()
