"""Oriented (rotated) boxes: a class, a confidence and a box turned by an angle (the anchor-free OBB head).

An OBB model is a :class:`~yolotrain.detector.BoxDetector` whose ``model(imgs)`` returns the decoded
``[B, N, 5+nc+1]`` predictions: cx, cy, w, h (input pixels), an objectness of 1, the class scores, then the angle in
radians (``[-pi/4, 3pi/4)``). The rotated NMS (ProbIoU) turns them into ``[n, 7]`` detections (cx, cy, w, h,
score, class, angle), scored against the DOTA-style labels by ProbIoU as Ultralytics' OBB val scores them.
"""

from __future__ import annotations

from ..detect import DetectTask
from .evaluate import OBBEvaluation
from .export import OBBExport
from .train import OBBTraining


class OBBTask(OBBTraining, OBBEvaluation, OBBExport, DetectTask):
    """Oriented boxes' answers to the shared code: detection's, and the rotation's where they differ."""

    name = "obb"


TASK = OBBTask()
