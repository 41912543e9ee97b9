"""The anchor-free YOLO family (the reference's YOLOv5u, YOLOv8 and YOLO11): blocks, detection, segmentation and
oriented-box and pose heads, architecture specs in the reference's model-YAML format, the detector/segmenter and the
classifiers."""

from .blocks import C2, C2PSA, DFL, Attention, Bottleneck, C2f, C3k, C3k2, PSABlock
from .classify import anchor_free_classifier
from .head import REG_MAX, AnchorFreeDetect
from .model import AnchorFreeYolo
from .obb import AnchorFreeOBB, angle_from_logits
from .pose import COCO_KEYPOINT_SHAPE, AnchorFreePose
from .segment import AnchorFreeProto, AnchorFreeSegment
from .spec import ARCHITECTURES, AnchorFreeSpec, build_layers, builtin_spec, check_spec, read_model_yaml

__all__ = ["ARCHITECTURES", "C2", "C2PSA", "COCO_KEYPOINT_SHAPE", "DFL", "REG_MAX", "AnchorFreeDetect",
           "AnchorFreeOBB", "AnchorFreePose", "AnchorFreeProto", "AnchorFreeSegment", "AnchorFreeSpec",
           "AnchorFreeYolo", "Attention", "Bottleneck", "C2f", "C3k", "C3k2", "PSABlock", "anchor_free_classifier",
           "angle_from_logits", "build_layers", "builtin_spec", "check_spec", "read_model_yaml"]
