"""Training criteria, one module per task's loss: :mod:`.detect` (YOLOv5's, the others' base),
:mod:`.segment` (its mask term added), :mod:`.classify` (cross-entropy), and :mod:`.divergence`, the error
every one of them raises when training has diverged."""

from .classify import ClassifyLoss
from .detect import YOLO_LOSS, LossConfig, YoloLoss
from .divergence import DivergenceError
from .segment import SegmentLoss

__all__ = ["YOLO_LOSS", "ClassifyLoss", "DivergenceError", "LossConfig", "SegmentLoss", "YoloLoss"]
