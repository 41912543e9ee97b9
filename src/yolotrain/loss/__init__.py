"""Training criteria, one module per task's loss: :mod:`.detect` (YOLOv5's, the others' base),
:mod:`.segment` (its mask term added), :mod:`.classify` (cross-entropy), :mod:`.anchor_free` (YOLOv8, YOLO11 and
YOLOv5u detection and segmentation, on the task-aligned assignment of :mod:`.assign`), :mod:`.anchor_free_obb`
(their oriented boxes, on the rotated assignment), :mod:`.anchor_free_pose` (their keypoint models' loss), and
:mod:`.divergence`, the error every one of them raises when training has diverged."""

from .anchor_free import AnchorFreeLoss, AnchorFreeLossConfig, AnchorFreeSegmentLoss
from .anchor_free_obb import AnchorFreeOBBLoss, AnchorFreeOBBLossConfig
from .anchor_free_pose import COCO_KEYPOINT_SIGMAS, AnchorFreePoseLoss, AnchorFreePoseLossConfig, keypoint_sigmas
from .classify import ClassifyLoss
from .detect import YOLO_LOSS, LossConfig, YoloLoss
from .divergence import DivergenceError
from .segment import SegmentLoss

__all__ = ["COCO_KEYPOINT_SIGMAS", "YOLO_LOSS", "AnchorFreeLoss", "AnchorFreeLossConfig", "AnchorFreeOBBLoss",
           "AnchorFreeOBBLossConfig", "AnchorFreePoseLoss", "AnchorFreePoseLossConfig", "AnchorFreeSegmentLoss",
           "ClassifyLoss", "DivergenceError", "LossConfig", "SegmentLoss", "YoloLoss", "keypoint_sigmas"]
