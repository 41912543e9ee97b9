"""Weights & Biases: one run per training run with the settings as its config, each epoch's values under
the reference's tags, validation images with their predicted boxes, and the best weights as the model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import torch

from .base import LoggerError, best_weights, error_line, import_package, tagged
from .tracker import Tracker

# The reference's W&B project for runs under the default project folder.
WANDB_DEFAULT_PROJECT = "YOLOv5"
# The reference's W&B panel of validation images with their predicted boxes, and how many images an epoch it gets.
BOX_IMAGES_KEY = "Bounding Box Debugger/Images"
MAX_BOX_IMAGES = 16


def box_interval(bbox_interval: int, epochs: int, plots: bool) -> int:
    """Epochs between W&B images of validation predictions (0: none): ``bbox_interval``, or for -1 the
    reference's choice, ``epochs // 10`` (each epoch in runs of 10 or fewer), none without plots."""
    if bbox_interval != -1:
        return bbox_interval
    return (epochs // 10 if epochs > 10 else 1) if plots else 0


class WandbLogger(Tracker):
    """One W&B run per training run, its files under ``wandb`` in the run folder; ``WANDB_MODE`` and the
    other ``WANDB_*`` variables apply as usual (``WANDB_MODE=offline`` needs no account).

    Every :func:`box_interval` epochs (counted from 1) the first ``MAX_BOX_IMAGES`` validation images go
    with that epoch's results, each with its predicted boxes, as the reference's ``--bbox_interval`` logs
    them; the images are resized to the training size at most."""

    def __init__(self, save_dir: Path, config: Mapping[str, Any], saved: Mapping[str, Any],
                 log: Callable[[str], None]) -> None:
        wandb = self._wandb = import_package("wandb", "wandb")
        project = config["project"]
        default_project = WANDB_DEFAULT_PROJECT if Path(project) == Path("runs/train") else Path(project).name
        try:
            self.run = wandb.init(project=saved.get("project", default_project), entity=config.get("entity"),
                                  name=save_dir.name, dir=str(save_dir), config=dict(config),
                                  id=saved.get("id"), resume="allow" if saved.get("id") else None)
        except Exception as error:  # login, network and settings failures: one line, training not started
            raise LoggerError(f"--logger wandb could not start a run ({error_line(error)}); "
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
        """Gather the validation images of epoch ``epoch`` when it is one to log."""
        self.box_epoch = epoch if self.box_interval and epoch % self.box_interval == 0 else None
        self.box_images = []
        self.class_labels = dict(enumerate(names))

    def val_image(self, path: str, detections: torch.Tensor) -> None:
        """Keep the image as a W&B image with its boxes while the epoch gathers them."""
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
        row: dict[str, Any] = tagged(values)
        if self.box_images and epoch == self.box_epoch:
            row[BOX_IMAGES_KEY] = self.box_images
        self.run.log(row, step=epoch)
        self.box_epoch, self.box_images = None, []

    def finish(self, weights: Path, failed: bool) -> None:
        files = best_weights(weights)
        if not failed and files:
            # The best weights as the run's model artifact, named as the reference's W&B logger names it.
            artifact = self._wandb.Artifact(f"run_{self.run.id}_model", type="model")
            for file in files:
                artifact.add_file(str(file))
            self.run.log_artifact(artifact, aliases=["latest", "best"])
        self.run.finish(exit_code=1 if failed else 0)
