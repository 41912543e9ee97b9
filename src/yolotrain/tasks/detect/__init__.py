"""Object detection: boxes with a class and a confidence (YOLOv5's anchor-based head).

A detection model is a :class:`~yolotrain.detector.BoxDetector`: ``model(imgs)`` takes ``[B, 3, H, W]`` float
images (0..1) and returns the decoded ``[B, N, 5+nc]`` predictions (xywh, objectness, class scores) that NMS
turns into detections; an export with NMS inside (``end_to_end``) gives the final ``[n, 6]`` boxes through
``detections`` instead.
"""

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
