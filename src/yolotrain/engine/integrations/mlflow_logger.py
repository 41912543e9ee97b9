"""MLflow: one run per training run, with the settings as parameters, each epoch's ``results.csv`` values
and the best and last weights as artifacts."""

from __future__ import annotations

import importlib
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .base import flat_settings, import_package
from .tracker import Tracker

_MLFLOW_BATCH = 100  # the most parameters MLflow takes in one request


def mlflow_name(column: str) -> str:
    """A ``results.csv`` column as an MLflow metric name (letters, digits, ``_ - . /`` and spaces)."""
    return re.sub(r"[^\w\-./ ]", "_", column)


def require_mlflow() -> None:
    """MLflow and, for the default store (a SQLite file in the run folder), SQLAlchemy and Alembic."""
    import_package("mlflow", "mlflow")
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        for module in ("sqlalchemy", "alembic"):
            import_package(module, "mlflow")


class MLflowLogger(Tracker):
    """One MLflow run per training run, in ``$MLFLOW_TRACKING_URI`` or, when unset, in ``mlflow.db`` with
    artifacts under ``mlruns``, both in the run folder (nothing goes to a home folder or the network)."""

    def __init__(self, save_dir: Path, config: Mapping[str, Any], saved: Mapping[str, Any],
                 log: Callable[[str], None]) -> None:
        mlflow = import_package("mlflow", "mlflow")
        self.entities = importlib.import_module("mlflow.entities")
        default_uri = f"sqlite:///{(save_dir / 'mlflow.db').resolve()}"
        self.tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or saved.get("tracking_uri") or default_uri
        self.client = mlflow.MlflowClient(self.tracking_uri)
        # A resumed run continues its MLflow run when it logs to the same store; otherwise it starts one.
        self.run_id = saved.get("run_id") if saved.get("tracking_uri") == self.tracking_uri else None
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            artifacts = (save_dir / "mlruns").resolve().as_uri() if self.tracking_uri == default_uri else None
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or str(config["project"])
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else \
                self.client.create_experiment(experiment, artifact_location=artifacts)
            self.run_id = self.client.create_run(experiment_id, run_name=save_dir.name).info.run_id
            params = [self.entities.Param(k, str(v)) for k, v in flat_settings(config).items()]
            for start in range(0, len(params), _MLFLOW_BATCH):
                self.client.log_batch(self.run_id, params=params[start:start + _MLFLOW_BATCH])
        log(f"MLflow: run {self.run_id} in {self.tracking_uri}")

    def state(self) -> dict[str, str]:
        return {"tracking_uri": self.tracking_uri, "run_id": self.run_id}

    def log_row(self, epoch: int, values: Mapping[str, float]) -> None:
        stamp = int(time.time() * 1000)
        metrics = [self.entities.Metric(mlflow_name(k), v, stamp, epoch) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, weights: Path, failed: bool) -> None:
        if not failed:
            for name in ("best", "last"):
                for suffix in (".safetensors", ".json"):
                    if (weights / f"{name}{suffix}").is_file():
                        self.client.log_artifact(self.run_id, str(weights / f"{name}{suffix}"), "weights")
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
