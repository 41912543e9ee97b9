"""YOLOv5 model: blocks, detection and segmentation heads, architecture specs and the full model."""

from .blocks import C3, SPP, SPPF, Bottleneck, Concat, Conv, Focus
from .detect import DEFAULT_ANCHORS, STRIDES, Detect
from .segment import Proto, Segment
from .spec import P5_ANCHORS, P6_ANCHORS, VERSIONS, ModelSpec, builtin_spec, read_model_yaml
from .yolo import Yolov5, parse_version

__all__ = ["C3", "SPP", "SPPF", "Bottleneck", "Concat", "Conv", "DEFAULT_ANCHORS", "Detect", "Focus", "ModelSpec",
           "P5_ANCHORS", "P6_ANCHORS", "Proto", "STRIDES", "Segment", "VERSIONS", "Yolov5", "builtin_spec",
           "parse_version", "read_model_yaml"]
