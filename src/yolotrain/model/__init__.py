"""YOLOv5 model: blocks, detection head and the full detector."""

from .blocks import C3, SPPF, Bottleneck, Concat, Conv
from .detect import DEFAULT_ANCHORS, STRIDES, Detect
from .yolo import VERSIONS, Yolov5, parse_version

__all__ = ["C3", "SPPF", "Bottleneck", "Concat", "Conv", "DEFAULT_ANCHORS", "STRIDES", "Detect", "VERSIONS",
           "Yolov5", "parse_version"]
