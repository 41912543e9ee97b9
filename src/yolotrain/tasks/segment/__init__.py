"""Instance segmentation: detection's boxes, each with a mask made from prototype masks and coefficients."""

from __future__ import annotations

from ..detect import DetectTask
from .evaluate import SegmentEvaluation
from .export import SegmentExport
from .train import SegmentTraining


class SegmentTask(SegmentTraining, SegmentEvaluation, SegmentExport, DetectTask):
    """Segmentation's answers to the shared code: detection's, and the masks' where they differ."""

    name = "segment"


TASK = SegmentTask()
