"""Comet: one experiment per training run with the settings as parameters, each epoch's values under the
reference's tags, the final validation images and the best weights as the experiment's model."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import LoggerError, best_weights, error_line, import_package, new_run_key, tagged
from .tracker import Tracker


def comet_online(comet_ml: Any) -> bool:
    """Whether Comet logs to its server: an API key is configured and neither ``COMET_MODE=offline`` (the
    reference's variable) nor Comet's own offline setting (``COMET_OFFLINE``) asks for offline."""
    config = comet_ml.get_config()
    offline = os.environ.get("COMET_MODE", "").lower() == "offline" or config["comet.offline"]
    return bool(config["comet.api_key"]) and not offline


class CometLogger(Tracker):
    """One Comet experiment per training run, named after the run folder, in the project
    ``$COMET_PROJECT_NAME`` (default: the ``--project`` folder's name). Without an API key it is an offline
    experiment: each session of the run is a zip under ``comet`` in the run folder, for ``comet upload``.
    Its key is chosen here and kept in ``loggers.json``, so a resumed run appends to the same experiment,
    online or offline (Comet's ``get_or_create``)."""

    def __init__(self, save_dir: Path, config: Mapping[str, Any], saved: Mapping[str, Any],
                 log: Callable[[str], None]) -> None:
        comet_ml = import_package("comet_ml", "comet")
        self.key = saved.get("key") or new_run_key()
        online = comet_online(comet_ml)
        folder = save_dir / "comet"
        if not online:
            folder.mkdir(parents=True, exist_ok=True)
        # Values are logged as results.csv has them, so Comet's automatic logging and argument parsing are off.
        settings = comet_ml.ExperimentConfig(
            name=save_dir.name, offline_directory=str(folder), display_summary_level=0, log_code=False,
            log_graph=False, parse_args=False, auto_output_logging=False, auto_param_logging=False,
            auto_metric_logging=False, log_env_host=online)  # offline: no look-up of the host's address
        project = os.environ.get("COMET_PROJECT_NAME") or Path(config["project"]).name
        try:
            self.experiment = comet_ml.start(project_name=project, experiment_key=self.key, mode="get_or_create",
                                             online=online, experiment_config=settings)
        except Exception as error:  # a bad key, no network, a bad folder: one line, training not started
            raise LoggerError(f"--logger comet could not start an experiment ({error_line(error)}); "
                              f"COMET_MODE=offline logs without an account") from None
        if not saved:
            self.experiment.log_parameters(dict(config))
        where = f"project {project}" if online else f"offline archives in {folder} (comet upload)"
        log(f"Comet: experiment {self.key} in {where}")

    def state(self) -> dict[str, str]:
        return {"key": self.key}

    def log_row(self, epoch: int, values: Mapping[str, float]) -> None:
        self.experiment.log_metrics(tagged(values), step=epoch, epoch=epoch)

    def log_images(self, files: Sequence[Path], epoch: int) -> None:
        for file in files:
            self.experiment.log_image(str(file), name=f"val_predictions/{file.name}", step=epoch)

    def finish(self, weights: Path, failed: bool) -> None:
        if not failed:
            for file in best_weights(weights):
                self.experiment.log_model("best", str(file))
        self.experiment.end()
