"""The experiment trackers of ``--logger``, one module each, and their registry.

Each tracker's package is imported only when its logger is asked for; a missing one is one line naming
the extra that installs it (:func:`require_loggers`). Without a server configured, MLflow (a store), Comet
(offline archives), Neptune (offline data) and ClearML (an offline session) log into the run folder, as
DVCLive always does; W&B does with ``WANDB_MODE=offline``, and otherwise stops the run in one line."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .base import LR_TAGS, TAGS, LoggerError, flat_settings, image_files, import_package
from .clearml_logger import ClearMLLogger
from .comet_logger import CometLogger
from .dvclive_logger import DVCLiveLogger
from .mlflow_logger import MLflowLogger, mlflow_name, require_mlflow
from .neptune_logger import NeptuneLogger
from .tracker import Tracker
from .wandb_logger import BOX_IMAGES_KEY, MAX_BOX_IMAGES, WANDB_DEFAULT_PROJECT, WandbLogger, box_interval

__all__ = ["BOX_IMAGES_KEY", "INTEGRATIONS", "LR_TAGS", "MAX_BOX_IMAGES", "PACKAGES", "TAGS",
           "WANDB_DEFAULT_PROJECT", "ClearMLLogger", "CometLogger", "DVCLiveLogger", "LoggerError", "MLflowLogger",
           "NeptuneLogger", "Tracker", "WandbLogger", "box_interval", "flat_settings", "image_files", "mlflow_name",
           "require_loggers"]

TrackerFactory = Callable[[Path, Mapping[str, Any], Mapping[str, Any], Callable[[str], None]], Tracker]
# --logger name → the tracker (called with the run folder, the resolved settings, what loggers.json kept
# for it and the console's line writer).
INTEGRATIONS: dict[str, TrackerFactory] = {
    "mlflow": MLflowLogger, "wandb": WandbLogger, "comet": CometLogger, "clearml": ClearMLLogger,
    "neptune": NeptuneLogger, "dvc": DVCLiveLogger}
# --logger name → the module its tracker needs (the extra that installs it has the logger's name).
PACKAGES = {"mlflow": "mlflow", "wandb": "wandb", "comet": "comet_ml", "clearml": "clearml", "neptune": "neptune",
            "dvc": "dvclive"}


def require_loggers(names: Iterable[str]) -> None:
    """Import the package of each logger in ``names`` now, so a missing one stops the run before training.

    Raises:
        LoggerError: a package is not installed (the message names the extra that installs it).
    """
    for name in names:
        if name == "mlflow":
            require_mlflow()
        else:
            import_package(PACKAGES[name], name)
