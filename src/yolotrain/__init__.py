"""yolotrain: train, evaluate, export and debug YOLO models (detection, segmentation, classification) in PyTorch."""

from .data import get_loaders
from .detector import Detector
from .engine import TrainConfig, resolve_config, train
from .eval.val import val
from .interop import export, resolve_model
from .interop import resolve_trainable as load
from .loss import YOLO_LOSS, DivergenceError, YoloLoss
from .model import Yolov5
from .prediction.run import predict
from .settings import ConfigError
from .track.run import track  # the function: the package's names import as `from yolotrain.track import ...`
from .tuning import tune
from .yolo import YOLO

__all__ = ["YOLO", "YOLO_LOSS", "ConfigError", "Detector", "DivergenceError", "TrainConfig", "YoloLoss", "Yolov5",
           "export", "get_loaders", "load", "predict", "resolve_config", "resolve_model", "track", "train", "tune",
           "val"]
__version__ = "0.1.0"
