"""ClearML: one task per training run with the settings as its configuration, each epoch's values as
scalars (title and series from the reference's tags), the final validation images as debug samples and
the best weights as artifacts."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import LoggerError, best_weights, error_line, import_package, tagged
from .tracker import Tracker

# ClearML's automatic logging, all off (keys it does not find here default to on): the values are logged as
# results.csv has them, and its repository and package analysis takes minutes at the end of a run.
_AUTOMATIC = ("matplotlib", "tensorflow", "tensorboard", "pytorch", "xgboost", "scikit", "fastai", "lightgbm", "hydra",
              "detect_repository", "tfdefines", "joblib", "megengine", "catboost", "gradio")


def clearml_configured() -> bool:
    """Whether ClearML has a server to log to: credentials in the environment or in its configuration file."""
    from clearml.backend_api.session.defs import ENV_ACCESS_KEY
    from clearml.config import config_obj

    return bool(ENV_ACCESS_KEY.get() or config_obj.get("api.credentials.access_key", None))


class ClearMLLogger(Tracker):
    """One ClearML task per training run, named after the run folder, in the project named after the
    ``--project`` folder. Without credentials (or with ``CLEARML_OFFLINE_MODE=1``) the task is offline:
    its session is written under ``clearml`` in the run folder (``$CLEARML_CACHE_DIR`` when set) and zipped
    when the run ends, for ``Task.import_offline_session``. ClearML's automatic logging (frameworks,
    repository, console, arguments, resources) is off: the values are logged as ``results.csv`` has them.
    A resumed run continues the same task (its id is kept in ``loggers.json``)."""

    def __init__(self, save_dir: Path, config: Mapping[str, Any], saved: Mapping[str, Any],
                 log: Callable[[str], None]) -> None:
        clearml = import_package("clearml", "clearml")
        offline = clearml.Task.is_offline() or not clearml_configured()
        # An offline session goes to the cache folder's "offline": the run folder's, unless one is set.
        self.cache_dir = None if os.environ.get("CLEARML_CACHE_DIR") or not offline else save_dir / "clearml"
        if self.cache_dir is not None:
            os.environ["CLEARML_CACHE_DIR"] = str(self.cache_dir)
        try:
            clearml.Task.set_offline(offline)
            # continue_last_task=0: a resumed run's epochs keep their numbers (no iteration offset).
            self.task = clearml.Task.init(
                project_name=Path(config["project"]).name, task_name=save_dir.name,
                reuse_last_task_id=saved.get("id", False), continue_last_task=0 if saved.get("id") else False,
                auto_connect_frameworks=dict.fromkeys(_AUTOMATIC, False), auto_connect_arg_parser=False,
                auto_connect_streams=False, auto_resource_monitoring=False)
        except Exception as error:  # a server that cannot be reached, bad credentials: one line
            self._restore_cache_dir()
            raise LoggerError(f"--logger clearml could not start a task ({error_line(error)}); "
                              f"CLEARML_OFFLINE_MODE=1 logs without a server") from None
        if not saved:
            self.task.connect(dict(config), name="settings")
        self.logger = self.task.get_logger()
        where = f"offline in {self.task.get_offline_mode_folder()}" if offline else "on the server"
        log(f"ClearML: task {self.task.id} {where}")

    def _restore_cache_dir(self) -> None:
        if self.cache_dir is not None:
            del os.environ["CLEARML_CACHE_DIR"]
            self.cache_dir = None

    def state(self) -> dict[str, str]:
        return {"id": self.task.id}

    def log_row(self, epoch: int, values: Mapping[str, float]) -> None:
        for tag, value in tagged(values).items():
            title, _, series = tag.rpartition("/")
            self.logger.report_scalar(title or series, series, value, iteration=epoch)

    def log_images(self, files: Sequence[Path], epoch: int) -> None:
        for file in files:
            self.logger.report_image("val_predictions", file.name, iteration=epoch, local_path=str(file))

    def finish(self, weights: Path, failed: bool) -> None:
        if not failed:
            for file in best_weights(weights):
                self.task.upload_artifact(f"weights/{file.name}", artifact_object=str(file), wait_on_upload=True)
        if failed:
            self.task.mark_failed(status_reason="training stopped on an error")
        self.task.close()
        self._restore_cache_dir()
