"""The interface of an experiment tracker of ``--logger``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch


class Tracker(ABC):
    """An experiment tracker beside TensorBoard: one run per training run, found again on resume through
    :meth:`state` (kept in the run folder's ``loggers.json``), closed with the weights folder when training
    ends."""

    @abstractmethod
    def state(self) -> dict[str, str]:
        """What a resumed run needs to find this tracker's run again."""

    @abstractmethod
    def log_row(self, epoch: int, values: Mapping[str, float]) -> None:
        """One ``results.csv`` row's values (empty validation cells left out) at its epoch (from 1)."""

    @abstractmethod
    def finish(self, weights: Path, failed: bool) -> None:
        """The run ended (``failed``: on an error or Ctrl-C); ``weights`` is the run's weights folder."""

    # The image hooks are optional: a tracker without images logs nothing there.
    def begin_epoch(self, epoch: int, names: Sequence[str]) -> None:  # noqa: B027
        """Epoch ``epoch`` (from 1) is about to be validated, on data of the classes ``names``."""

    def val_image(self, path: str, detections: torch.Tensor) -> None:  # noqa: B027
        """One validation image's detections (``x1 y1 x2 y2 conf class`` in its pixels)."""

    def log_images(self, files: Sequence[Path], epoch: int) -> None:  # noqa: B027
        """The final validation's drawn predictions, at the last epoch."""
