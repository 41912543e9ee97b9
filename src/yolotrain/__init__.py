"""yolotrain: train, evaluate, export and debug YOLOv5 object detectors in PyTorch."""

from .loss import YOLO_LOSS, NonFiniteLossError, YoloLoss
from .model import Yolov5

__all__ = ["YOLO_LOSS", "NonFiniteLossError", "YoloLoss", "Yolov5"]
__version__ = "0.1.0"
