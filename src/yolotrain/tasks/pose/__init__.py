"""Pose (keypoint) estimation: detection's boxes, each with ``K`` keypoints of ``D`` values (x, y, and with D == 3
a visibility).

A pose model is a :class:`~yolotrain.detector.BoxDetector` whose ``model(imgs)`` returns the decoded
``[B, N, 5+nc+K*D]`` predictions: detection's columns, then the keypoints in input pixels, keypoint-major (x0, y0,
v0, x1, ...), which ``nms_extra_columns`` tells NMS to carry along; its ``kpt_shape`` is ``(K, D)``, its dataset's
(the YAML's ``kpt_shape``). Only the anchor-free family has a keypoint head (yolov8n-pose, yolo11n-pose,
yolov5nu-pose ...).
"""

from __future__ import annotations

from ..detect import DetectTask
from .evaluate import PoseEvaluation
from .export import PoseExport
from .train import PoseTraining


class PoseTask(PoseTraining, PoseEvaluation, PoseExport, DetectTask):
    """Pose's answers to the shared code: detection's, and the keypoints' where they differ."""

    name = "pose"


TASK = PoseTask()
