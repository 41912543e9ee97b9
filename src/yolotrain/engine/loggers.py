"""Experiment loggers beside ``results.csv``: TensorBoard event files in the run folder when installed,
and MLflow and Weights & Biases when asked for (``--logger mlflow wandb``).

Each epoch's row of ``results.csv`` is sent as scalars under the reference's tags (``train/box_loss``,
``metrics/mAP_0.5``, ``x/lr0`` …) to TensorBoard and W&B, so dashboards built for the reference read
these runs too; the final validation's drawn predictions go to TensorBoard as one image mosaic. MLflow
gets the same values under the ``results.csv`` column names, the resolved settings as parameters and
the best and last weights as artifacts; W&B gets the best weights as the run's model artifact and, every
``--bbox_interval`` epochs, validation images with their predicted boxes (the reference's "Bounding Box
Debugger" panel).

The MLflow and W&B packages are imported only when their logger is asked for. A resumed run goes on
logging into the same MLflow run and W&B run: their ids are kept in ``loggers.json`` in the run folder.
"""

from __future__ import annotations

import csv
import importlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import cv2
import numpy as np
import torch
from tqdm import tqdm

from ..atomic import write_atomic
from ..callbacks import Callbacks
from ..task import get_task, task_names
from .plots import plot_results

# The learning rates' columns → the reference's TensorBoard tags (the others are the tasks': Task.logger_tags).
LR_TAGS = {"lr0": "x/lr0", "lr1": "x/lr1", "lr2": "x/lr2"}
# results.csv column → the reference's TensorBoard tag, for every registered task's columns (a column means the
# same in every task that has it, so one mapping serves all runs).
TAGS = {**{column: tag for name in task_names() for column, tag in get_task(name).logger_tags.items()}, **LR_TAGS}
MOSAIC_TILE = 320  # pixels per side of each image in the validation mosaic
MOSAIC_COLUMNS = 4
# Where a run keeps the ids of its MLflow and W&B runs, so that a resumed run logs into the same ones.
STATE_FILE = "loggers.json"
# The reference's W&B project for runs under the default project folder.
WANDB_DEFAULT_PROJECT = "YOLOv5"
_MLFLOW_BATCH = 100  # the most parameters MLflow takes in one request
# The reference's W&B panel of validation images with their predicted boxes, and how many images an epoch it gets.
BOX_IMAGES_KEY = "Bounding Box Debugger/Images"
MAX_BOX_IMAGES = 16


class LoggerError(RuntimeError):
    """A logger asked for with ``--logger`` cannot start; the message says why and what to do."""


def require_loggers(names: Iterable[str]) -> None:
    """Import the package of each logger in ``names`` now, so a missing one stops the run before training.

    Raises:
        LoggerError: a package is not installed (the message names the extra that installs it).
    """
    for name in names:
        _import(name)
        if name == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
            # The default store, a SQLite file in the run folder, needs these two.
            for module in ("sqlalchemy", "alembic"):
                _import(module, needed_by=name)


def _import(module: str, needed_by: str | None = None) -> Any:
    logger = needed_by or module
    try:
        return importlib.import_module(module)
    except ImportError:
        raise LoggerError(f"--logger {logger} needs the {module} package: pip install 'yolotrain[{logger}]'") \
            from None


def flat_settings(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested configuration as ``{"data.img_size": 640, ...}`` (MLflow parameters are flat)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def mlflow_name(column: str) -> str:
    """A ``results.csv`` column as an MLflow metric name (letters, digits, ``_ - . /`` and spaces)."""
    return re.sub(r"[^\w\-./ ]", "_", column)


def _last_row(results_csv: Path) -> dict[str, str] | None:
    with Path(results_csv).open(newline="") as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else None


def _values(row: Mapping[str, str]) -> dict[str, float]:
    """The numbers of a results.csv row, without the epoch and the empty validation cells."""
    return {k: float(v) for k, v in row.items() if k != "epoch" and v not in (None, "")}


class MLflowLogger:
    """One MLflow run per training run, in ``$MLFLOW_TRACKING_URI`` or, when unset, in ``mlflow.db`` with
    artifacts under ``mlruns``, both in the run folder (nothing goes to a home folder or the network)."""

    def __init__(self, save_dir: Path, config: Mapping[str, Any], saved: Mapping[str, Any],
                 log: Callable[[str], None]) -> None:
        mlflow = _import("mlflow")
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


def box_interval(bbox_interval: int, epochs: int, plots: bool) -> int:
    """Epochs between W&B images of validation predictions (0: none): ``bbox_interval``, or for -1 the
    reference's choice, ``epochs // 10`` (each epoch in runs of 10 or fewer), none without plots."""
    if bbox_interval != -1:
        return bbox_interval
    return (epochs // 10 if epochs > 10 else 1) if plots else 0


class WandbLogger:
    """One W&B run per training run, its files under ``wandb`` in the run folder; ``WANDB_MODE`` and the
    other ``WANDB_*`` variables apply as usual (``WANDB_MODE=offline`` needs no account).

    Every :func:`box_interval` epochs (counted from 1) the first ``MAX_BOX_IMAGES`` validation images go
    with that epoch's results, each with its predicted boxes, as the reference's ``--bbox_interval`` logs
    them; the images are resized to the training size at most."""

    def __init__(self, save_dir: Path, config: Mapping[str, Any], saved: Mapping[str, Any],
                 log: Callable[[str], None]) -> None:
        wandb = self._wandb = _import("wandb")
        project = config["project"]
        default_project = WANDB_DEFAULT_PROJECT if Path(project) == Path("runs/train") else Path(project).name
        try:
            self.run = wandb.init(project=saved.get("project", default_project), entity=config.get("entity"),
                                  name=save_dir.name, dir=str(save_dir), config=dict(config),
                                  id=saved.get("id"), resume="allow" if saved.get("id") else None)
        except Exception as error:  # login, network and settings failures: one line, training not started
            raise LoggerError(f"--logger wandb could not start a run ({type(error).__name__}: {error}); "
                              f"WANDB_MODE=offline logs without an account") from None
        log(f"W&B: run {self.run.id} in project {self.run.project}, files in {save_dir / 'wandb'}")
        self.box_interval = box_interval(config["bbox_interval"], config["epochs"], config["eval"]["plots"])
        self.max_side = config["data"]["img_size"]
        self.box_epoch: int | None = None  # the epoch whose validation images are being gathered
        self.box_images: list[Any] = []
        self.class_labels: dict[int, str] = {}

    def state(self) -> dict[str, str]:
        return {"project": self.run.project, "id": self.run.id}

    def begin_epoch(self, epoch: int, names: Sequence[str]) -> None:
        """Epoch ``epoch`` (from 1) is about to be validated: gather its images when it is one to log."""
        self.box_epoch = epoch if self.box_interval and epoch % self.box_interval == 0 else None
        self.box_images = []
        self.class_labels = dict(enumerate(names))

    def val_image(self, path: str, detections: torch.Tensor) -> None:
        """One validation image's detections (``x1 y1 x2 y2 conf class`` in its pixels), kept as a W&B image
        with boxes while the epoch gathers them."""
        if self.box_epoch is None or len(self.box_images) >= MAX_BOX_IMAGES:
            return
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            return
        scale = min(1.0, self.max_side / max(image.shape[:2]))
        if scale < 1:
            image = cv2.resize(image, (round(image.shape[1] * scale), round(image.shape[0] * scale)),
                               interpolation=cv2.INTER_AREA)
        boxes = [{"position": {"minX": x1 * scale, "minY": y1 * scale, "maxX": x2 * scale, "maxY": y2 * scale},
                  "class_id": int(c), "box_caption": f"{self.class_labels.get(int(c), int(c))} {conf:.3f}",
                  "scores": {"class_score": conf}, "domain": "pixel"}
                 for x1, y1, x2, y2, conf, c in detections[:, :6].tolist()]
        self.box_images.append(self._wandb.Image(
            cv2.cvtColor(image, cv2.COLOR_BGR2RGB), caption=Path(path).name,
            boxes={"predictions": {"box_data": boxes, "class_labels": self.class_labels}}))

    def log_row(self, epoch: int, values: Mapping[str, float]) -> None:
        row = {TAGS.get(k, k): v for k, v in values.items()}
        if self.box_images and epoch == self.box_epoch:
            row[BOX_IMAGES_KEY] = self.box_images
        self.run.log(row, step=epoch)
        self.box_epoch, self.box_images = None, []

    def finish(self, weights: Path, failed: bool) -> None:
        files = [weights / f"best{suffix}" for suffix in (".safetensors", ".json")]
        if not failed and all(f.is_file() for f in files):
            # The best weights as the run's model artifact, named as the reference's W&B logger names it.
            artifact = self._wandb.Artifact(f"run_{self.run.id}_model", type="model")
            for file in files:
                artifact.add_file(str(file))
            self.run.log_artifact(artifact, aliases=["latest", "best"])
        self.run.finish(exit_code=1 if failed else 0)


class IntegrationLogger(Protocol):
    """An experiment tracker beside TensorBoard: one run per training run, found again on resume
    through :meth:`state`, closed with the weights folder when training ends."""

    def state(self) -> dict[str, str]: ...

    def log_row(self, epoch: int, values: Mapping[str, float]) -> None: ...

    def finish(self, weights: Path, failed: bool) -> None: ...


INTEGRATIONS: dict[str, Callable[..., IntegrationLogger]] = {"mlflow": MLflowLogger, "wandb": WandbLogger}


class RunLoggers:
    """The loggers of one run (rank 0 only). Without ``tensorboard`` installed TensorBoard logs nothing
    and says once how to get it; ``integrations`` (``mlflow``, ``wandb``) must be installed
    (:func:`require_loggers`). ``config`` is the run's resolved settings (:meth:`TrainConfig.to_dict`)."""

    def __init__(self, save_dir: Path, enabled: bool, log: Callable[[str], None], integrations: Iterable[str] = (),
                 config: Mapping[str, Any] | None = None, resumed: bool = False) -> None:
        self.save_dir = Path(save_dir)
        self.writer = None
        self.integrations: list[IntegrationLogger] = []
        state_path = self.save_dir / STATE_FILE
        saved = json.loads(state_path.read_text()) if resumed and state_path.is_file() else {}
        names = tuple(integrations)
        for name in names:
            try:
                self.integrations.append(INTEGRATIONS[name](self.save_dir, dict(config or {}), saved.get(name, {}),
                                                            log))
            except LoggerError:  # the trackers already started must not stay open as running
                for started in self.integrations:
                    started.finish(self.save_dir / "weights", failed=True)
                raise
        if self.integrations:
            state = {name: logger.state() for name, logger in zip(names, self.integrations)}
            write_atomic(state_path, lambda temp: temp.write_text(json.dumps(state, indent=1)))
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log("TensorBoard: not installed, so results go to results.csv/png only (pip install tensorboard)")
            return
        self.writer = SummaryWriter(log_dir=str(self.save_dir))
        log(f"TensorBoard: tensorboard --logdir {self.save_dir.parent}")

    def begin_epoch(self, epoch: int, names: Sequence[str]) -> None:
        """Epoch ``epoch`` (from 1) is about to be validated, on data of the classes ``names``."""
        for logger in self.integrations:
            if isinstance(logger, WandbLogger):
                logger.begin_epoch(epoch, names)

    def val_image(self, path: str, detections: torch.Tensor) -> None:
        """One validation image's detections, in its pixels (the ``on_val_image_end`` hook's arguments)."""
        for logger in self.integrations:
            if isinstance(logger, WandbLogger):
                logger.val_image(path, detections)

    def log_epoch(self, results_csv: Path) -> None:
        """The last row of ``results_csv`` as scalars at its epoch (empty validation cells are skipped)."""
        row = _last_row(results_csv)
        if row is None:
            return
        epoch, values = int(row["epoch"]), _values(row)
        for logger in self.integrations:
            logger.log_row(epoch, values)
        if self.writer is None:
            return
        for column, tag in TAGS.items():
            if column in values:
                self.writer.add_scalar(tag, values[column], epoch)
        self.writer.flush()

    def log_images(self, folder: Path, tag: str, epoch: int) -> None:
        """The images in ``folder`` (the drawn validation predictions) as one mosaic."""
        if self.writer is None:
            return
        files = sorted(p for p in Path(folder).glob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
        tiles = []
        for path in files[: 2 * MOSAIC_COLUMNS]:
            im = cv2.imread(str(path))
            if im is None:
                continue
            scale = MOSAIC_TILE / max(im.shape[:2])
            im = cv2.resize(im, (round(im.shape[1] * scale), round(im.shape[0] * scale)))
            tile = np.full((MOSAIC_TILE, MOSAIC_TILE, 3), 114, dtype=np.uint8)
            tile[: im.shape[0], : im.shape[1]] = im
            tiles.append(tile)
        if not tiles:
            return
        tiles += [np.full_like(tiles[0], 114)] * (-len(tiles) % MOSAIC_COLUMNS)
        rows = [np.concatenate(tiles[i:i + MOSAIC_COLUMNS], 1) for i in range(0, len(tiles), MOSAIC_COLUMNS)]
        mosaic = cv2.cvtColor(np.concatenate(rows, 0), cv2.COLOR_BGR2RGB)
        self.writer.add_image(tag, mosaic, epoch, dataformats="HWC")
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        """End every logger (once); ``failed``: the run stopped on an error, which MLflow and W&B record."""
        for logger in self.integrations:
            logger.finish(self.save_dir / "weights", failed)
        self.integrations = []
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def write_results(path: Path, history: list[Mapping[str, Any]]) -> None:
    """results.csv from the run's history, which the last checkpoint holds: after a resume it shows
    each epoch once, whatever the interrupted run had written."""
    def write(temp: Path) -> None:
        with temp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(history[0]))
            writer.writeheader()
            for row in history:
                writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})

    write_atomic(path, write, durable=False)


class RunLogging:
    """results.csv, results.png and the experiment loggers as the training callbacks every run has.

    They write after each epoch's checkpoint (``on_model_save``), so results.csv never shows an epoch
    the last checkpoint does not hold."""

    def __init__(self) -> None:
        self.loggers: RunLoggers | None = None

    def register(self, callbacks: Callbacks) -> None:
        callbacks.add("on_train_start", self.start, user=False)
        callbacks.add("on_train_epoch_end", self.epoch_trained, user=False)
        callbacks.add("on_val_image_end", self.val_image, user=False)
        callbacks.add("on_model_save", self.epoch_saved, user=False)
        callbacks.add("on_train_end", self.end, user=False)
        callbacks.add("teardown", self.teardown, user=False)

    def start(self, trainer: Any) -> None:
        cfg = trainer.config
        self.loggers = RunLoggers(trainer.save_dir, cfg.tensorboard, tqdm.write, integrations=cfg.loggers,
                                  config=cfg.to_dict(), resumed=trainer.resume_from is not None)

    def epoch_trained(self, trainer: Any, epoch: int) -> None:
        self.loggers.begin_epoch(epoch + 1, trainer.names)

    def val_image(self, path: str, detections: torch.Tensor) -> None:
        self.loggers.val_image(path, detections)

    def epoch_saved(self, trainer: Any, last: Path, epoch: int, final: bool, best_fitness: float,
                    fitness: float) -> None:
        results = trainer.save_dir / "results.csv"
        write_results(results, trainer.history)
        if trainer.config.eval.plots:
            plot_results(results, trainer.save_dir / "results.png")
        self.loggers.log_epoch(results)
        if final and (trainer.save_dir / "val_predictions").is_dir():
            self.loggers.log_images(trainer.save_dir / "val_predictions", "val/predictions", epoch + 1)

    def end(self, trainer: Any, result: Any) -> None:
        self.loggers.close()

    def teardown(self, trainer: Any, error: BaseException | None) -> None:
        if self.loggers is not None and error is not None:
            self.loggers.close(failed=True)
