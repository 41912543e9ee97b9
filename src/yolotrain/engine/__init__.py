"""Training engine: configuration, optimiser recipe, EMA, distributed helpers and the trainer."""

from .config import TrainConfig
from .trainer import Trainer, TrainingError, TrainResult, train

__all__ = ["TrainConfig", "Trainer", "TrainingError", "TrainResult", "train"]
