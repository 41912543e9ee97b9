"""The classification loss of the reference's ``classify/train.py``: cross-entropy with label smoothing,
averaged over the batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .divergence import DivergenceError


class ClassifyLoss:
    """``criterion(logits [B, nc], labels [B], pred_size=...)`` → the mean cross-entropy; ``pred_size`` is
    accepted for the training step's call and unused. ``self.components`` holds the detached total."""

    component_names = ("loss",)

    def __init__(self, label_smoothing: float = 0.0) -> None:
        self.label_smoothing = float(label_smoothing)
        self.components = torch.zeros(1)

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor,
                 pred_size: Sequence[int] | None = None) -> torch.Tensor:
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing)
        if not bool(torch.isfinite(loss)):
            raise DivergenceError(f"classification loss is {loss.item()}")
        self.components = loss.detach().view(1)
        return loss
