"""Explicit training configuration: every knob of a run in one dataclass, saved with its checkpoints."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..data.augment import HYP_SCRATCH_LOW
from ..loss import DEFAULT_LOSS_HYP

# The reference "scratch-low" optimisation settings; augmentation and loss settings live with their code.
OPTIM_HYP: dict[str, float] = {
    "lrf": 0.01,             # final learning rate = lr0 * lrf
    "momentum": 0.937,       # SGD momentum / Adam beta1
    "weight_decay": 0.0005,
    "warmup_epochs": 3.0,
    "warmup_momentum": 0.8,
    "warmup_bias_lr": 0.1,
}

# Settings for the built-in shapes dataset: small images and an optimiser step every batch, so a CPU
# trains yolov5n past mAP50 0.5 in a couple of minutes (measured: 0.61 at epoch 15, 0.84 at epoch 22).
SHAPES_DEFAULTS = {"img_size": 160, "epochs": 30, "batch_size": 16, "optimizer": "AdamW", "lr0": 0.002,
                   "nominal_batch": 16}
# The reference's defaults for real datasets.
DATASET_DEFAULTS = {"img_size": 640, "epochs": 100, "batch_size": 16, "optimizer": "SGD", "nominal_batch": 64}


def default_hyp() -> dict[str, float]:
    return {**OPTIM_HYP, **HYP_SCRATCH_LOW, **DEFAULT_LOSS_HYP}


def load_hyp(overrides: dict[str, float] | str | Path | None) -> dict[str, float]:
    """Defaults updated from a dict or a hyper-parameter YAML; unknown keys are refused (typos)."""
    hyp = default_hyp()
    if overrides is None:
        return hyp
    if isinstance(overrides, (str, Path)):
        path = Path(overrides)
        if not path.is_file():
            raise FileNotFoundError(f"hyper-parameter file not found: {path}")
        overrides = yaml.safe_load(path.read_text()) or {}
        if not isinstance(overrides, dict):
            raise ValueError(f"{path}: expected a mapping of hyper-parameters")
    unknown = sorted(set(overrides) - set(hyp) - {"lr0"})
    if unknown:
        raise ValueError(f"unknown hyper-parameters: {', '.join(unknown)}")
    hyp.update({k: float(v) for k, v in overrides.items() if k != "lr0"})
    return hyp


@dataclass
class TrainConfig:
    """One training run. ``None`` sizes pick defaults suited to the data (see SHAPES_DEFAULTS)."""

    data: str | None = None              # dataset YAML or folder; None: the built-in shapes dataset
    model: str = "yolov5n"               # yolov5n|s|m|l|x, or a checkpoint to fine-tune
    img_size: int | None = None
    epochs: int | None = None
    batch_size: int | None = None        # global batch (all processes together)
    optimizer: str | None = None         # SGD | Adam | AdamW
    lr0: float | None = None             # None: 1e-2 for SGD, 1e-3 for Adam/AdamW
    device: str | None = None            # cpu, cuda, cuda:N; None: cuda:LOCAL_RANK when available
    workers: int | None = None
    seed: int = 0
    rect: bool = False
    close_mosaic: int = 0                # turn mosaic off for the last N epochs
    cos_lr: bool = False
    sync_bn: bool = False
    nominal_batch: int | None = None     # gradients are accumulated up to this batch size
    max_grad_norm: float = 10.0
    hyp: dict[str, float] = field(default_factory=dict)
    hyp_file: str | None = None
    project: str = "runs/train"
    name: str = "exp"
    exist_ok: bool = False
    resume: str | bool = False           # True: the latest run's last checkpoint; or a path
    doctor: bool = False                 # run the first step under the in-place doctor
    val: bool = True
    plots: bool = True

    def resolved(self) -> TrainConfig:
        """Fill settings left at None from the data's defaults."""
        defaults = dict(SHAPES_DEFAULTS if self.data is None else DATASET_DEFAULTS)
        if self.optimizer is not None:
            defaults.pop("lr0", None)  # a learning rate tuned for the default optimiser does not carry over
        return dataclasses.replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})
