"""Training engine: configuration, optimiser recipe, EMA, distributed helpers and the trainer."""

from .config import TrainConfig, resolve_config
from .trainer import Trainer, TrainingError, TrainResult, resume_training, train

__all__ = ["TrainConfig", "Trainer", "TrainingError", "TrainResult", "resolve_config", "resume_training", "train"]
