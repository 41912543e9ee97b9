"""Experiment loggers beside ``results.csv``: TensorBoard event files in the run folder when installed.

Each epoch's row of ``results.csv`` is sent as scalars under the reference's tags (``train/box_loss``,
``metrics/mAP_0.5``, ``x/lr0`` …), so dashboards built for the reference read these runs too; the
final validation's drawn predictions go in as one image mosaic.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

# results.csv column → the reference's TensorBoard tag.
TAGS = {
    "train_box": "train/box_loss", "train_obj": "train/obj_loss", "train_cls": "train/cls_loss",
    "precision": "metrics/precision", "recall": "metrics/recall", "mAP50": "metrics/mAP_0.5",
    "mAP50-95": "metrics/mAP_0.5:0.95", "val_box": "val/box_loss", "val_obj": "val/obj_loss",
    "val_cls": "val/cls_loss", "lr0": "x/lr0", "lr1": "x/lr1", "lr2": "x/lr2",
}
MOSAIC_TILE = 320  # pixels per side of each image in the validation mosaic
MOSAIC_COLUMNS = 4


class RunLoggers:
    """The loggers of one run (rank 0 only). Without ``tensorboard`` installed it logs nothing and
    says once how to get it."""

    def __init__(self, save_dir: Path, enabled: bool, log: Callable[[str], None]) -> None:
        self.save_dir = Path(save_dir)
        self.writer = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log("TensorBoard: not installed, so results go to results.csv/png only (pip install tensorboard)")
            return
        self.writer = SummaryWriter(log_dir=str(self.save_dir))
        log(f"TensorBoard: tensorboard --logdir {self.save_dir.parent}")

    def log_epoch(self, results_csv: Path) -> None:
        """The last row of ``results_csv`` as scalars at its epoch (empty validation cells are skipped)."""
        if self.writer is None:
            return
        with Path(results_csv).open(newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            return
        row = rows[-1]
        epoch = int(row["epoch"])
        for column, tag in TAGS.items():
            if row.get(column) not in (None, ""):
                self.writer.add_scalar(tag, float(row[column]), epoch)
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

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
