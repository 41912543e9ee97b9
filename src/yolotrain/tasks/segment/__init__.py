"""Instance segmentation: detection's boxes, each with a mask made from prototype masks and coefficients.

A segmentation model is a :class:`~yolotrain.detector.BoxDetector` whose ``model(imgs)`` returns
``(decoded, proto)``: ``decoded`` ``[B, N, 5+nc+nm]`` has the model's ``num_masks`` raw mask coefficients after
the class scores (``nms_extra_columns`` tells NMS to carry them along), ``proto`` ``[B, nm, H/4, W/4]`` the
prototype masks they weight; a detection's mask is ``sigmoid(coefficients @ proto) > 0.5`` inside its box
(:mod:`yolotrain.eval.masks`).
"""

from __future__ import annotations

from ..detect import DetectTask
from .evaluate import SegmentEvaluation
from .export import SegmentExport
from .train import SegmentTraining


class SegmentTask(SegmentTraining, SegmentEvaluation, SegmentExport, DetectTask):
    """Segmentation's answers to the shared code: detection's, and the masks' where they differ."""

    name = "segment"


TASK = SegmentTask()
