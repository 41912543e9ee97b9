"""The default callbacks of every run: ``results.csv``, ``results.png``, TensorBoard event files in the run
folder when installed, and the experiment trackers asked for with ``--logger`` (MLflow, W&B, Comet,
ClearML, Neptune, DVC; see :mod:`.integrations`).

Each epoch's row of ``results.csv`` is sent as scalars under the reference's tags (``train/box_loss``,
``metrics/mAP_0.5``, ``x/lr0`` …) to TensorBoard and the trackers (MLflow: under the column names), so
dashboards built for the reference read these runs too; the final validation's drawn predictions go to
TensorBoard as one image mosaic and to the trackers that take images as images. A resumed run goes on
logging into the same tracker runs: their ids are kept in ``loggers.json`` in the run folder.
"""

from __future__ import annotations

import csv
import json
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np
import torch
from tqdm import tqdm

from ..atomic import write_atomic
from ..callbacks import Callbacks
from .integrations import INTEGRATIONS, TAGS, LoggerError, Tracker, box_interval, image_files, require_loggers
from .plots import plot_results

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

# LoggerError, box_interval and require_loggers are the trackers', named here too for the run's callers.
__all__ = ["STATE_FILE", "TAGS", "LoggerError", "RunLoggers", "RunLogging", "box_interval", "require_loggers",
           "write_results"]

MOSAIC_TILE = 320  # pixels per side of each image in the validation mosaic
MOSAIC_COLUMNS = 4
# Where a run keeps the ids of its trackers' runs, so that a resumed run logs into the same ones.
STATE_FILE = "loggers.json"


def _summary_writer(log_dir: Path) -> SummaryWriter | None:
    """TensorBoard's ``SummaryWriter`` into ``log_dir``, or None where tensorboard is not installed.

    tensorboard takes TensorFlow for its file input/output where TensorFlow is installed: importing it costs about
    3 s of every run's start (measured on 2 cores) and prints TensorFlow's own log lines, while tensorboard's stub
    writes the same event files. Unless the program has already imported TensorFlow, tensorboard is pointed at
    its stub with the switch its own builds use (a module ``tensorboard.compat.notf``), held only while torch's
    writer is imported (which resolves tensorboard's lazy ``tf`` for the process); TensorFlow itself is left as
    it is.
    """
    switch = "tensorboard.compat.notf"
    point_at_stub = "tensorflow" not in sys.modules and switch not in sys.modules
    if point_at_stub:
        sys.modules[switch] = types.ModuleType(switch)
    try:
        # Importing torch's writer already resolves tensorboard's ``tf`` (and keeps what it resolved to).
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    finally:
        if point_at_stub:
            del sys.modules[switch]
    return SummaryWriter(log_dir=str(log_dir))


def _last_row(results_csv: Path) -> dict[str, str] | None:
    with Path(results_csv).open(newline="") as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else None


def _values(row: Mapping[str, str]) -> dict[str, float]:
    """The numbers of a results.csv row, without the epoch and the empty validation cells."""
    return {k: float(v) for k, v in row.items() if k != "epoch" and v not in (None, "")}


class RunLoggers:
    """The loggers of one run (rank 0 only). Without ``tensorboard`` installed TensorBoard logs nothing
    and says once how to get it; ``integrations`` (``--logger`` names: ``mlflow``, ``wandb``, ``comet``,
    ``clearml``, ``neptune``, ``dvc``) must be installed
    (:func:`require_loggers`). ``config`` is the run's resolved settings (:meth:`TrainConfig.to_dict`)."""

    def __init__(self, save_dir: Path, enabled: bool, log: Callable[[str], None], integrations: Iterable[str] = (),
                 config: Mapping[str, Any] | None = None, resumed: bool = False) -> None:
        self.save_dir = Path(save_dir)
        self.writer = None
        self.integrations: list[Tracker] = []
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
        self.writer = _summary_writer(self.save_dir)
        if self.writer is None:
            log("TensorBoard: not installed, so results go to results.csv/png only (pip install tensorboard)")
            return
        log(f"TensorBoard: tensorboard --logdir {self.save_dir.parent}")

    def begin_epoch(self, epoch: int, names: Sequence[str]) -> None:
        """Epoch ``epoch`` (from 1) is about to be validated, on data of the classes ``names``."""
        for logger in self.integrations:
            logger.begin_epoch(epoch, names)

    def val_image(self, path: str, detections: torch.Tensor) -> None:
        """One validation image's detections, in its pixels (the ``on_val_image_end`` hook's arguments)."""
        for logger in self.integrations:
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
        """The images in ``folder`` (the drawn validation predictions): to TensorBoard as one mosaic, to the
        trackers that take images one by one."""
        files = image_files(folder)
        for logger in self.integrations:
            logger.log_images(files, epoch)
        if self.writer is None:
            return
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
        """End every logger (once); ``failed``: the run stopped on an error, which the trackers record."""
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
