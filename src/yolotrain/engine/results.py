"""What a training run ends with: its result, or the one-line error that stopped it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class TrainingError(RuntimeError):
    """Training cannot go on (diverged, bad configuration); the message says why and what to do."""


@dataclass
class TrainResult:
    save_dir: Path
    last: Path
    best: Path
    epochs_run: int
    metrics: dict[str, float] = field(default_factory=dict)
