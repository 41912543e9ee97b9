"""Image classification: class scores for a whole image (a YOLOv5 backbone or a torchvision model)."""

from __future__ import annotations

from ...task import Task
from .evaluate import ClassifyEvaluation
from .export import ClassifyExport
from .model import ClassifyModel
from .train import ClassifyTraining


class ClassifyTask(ClassifyTraining, ClassifyEvaluation, ClassifyExport, ClassifyModel, Task):
    """Classification's answers to the shared code."""

    name = "classify"


TASK = ClassifyTask()
