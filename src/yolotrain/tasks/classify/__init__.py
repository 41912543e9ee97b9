"""Image classification: class scores for a whole image (a YOLOv5 backbone or a torchvision model).

A classifier (:class:`~yolotrain.model.classify.Classifier` or its export) is a plain
:class:`~yolotrain.detector.Detector`: ``model(imgs)`` takes images normalised with the ImageNet mean and
standard deviation and returns class logits ``[B, nc]``; it has no output levels, strides or NMS.
"""

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
