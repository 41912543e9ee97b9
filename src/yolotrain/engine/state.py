"""The state a run carries from step to step and saves for an exact resume: weights, EMA, optimiser,
schedule, gradient scaler, the gradients accumulated towards the nominal batch, the RNGs, the epoch and
the best fitness so far. It saves itself into the ``last`` (and ``best``) checkpoints and loads itself back."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoint import load_state, read_checkpoint, save_checkpoint
from ..model import Yolov5
from .ema import ModelEMA
from .results import TrainingError


class TrainState:
    """What an exact resume needs. ``ema`` is None on processes other than rank 0, which save nothing."""

    def __init__(self, model: Yolov5, ema: ModelEMA | None, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LambdaLR, scaler: torch.amp.GradScaler, accumulate: int) -> None:
        self.model = model
        self.ema = ema
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.accumulate = accumulate  # batches whose gradients make one optimiser step (grows in warm-up)
        self.last_opt_step = -1
        self.start_epoch = 0
        self.best_fitness = -1.0
        self.history: list[dict[str, Any]] = []  # the rows of results.csv so far
        # The last validation's mAP50-95 per class (None before one): --image-weights draws by it.
        self.class_maps: list[float] | None = None

    def save(self, weights: Path, epoch: int, metrics: dict[str, float], improved: bool,
             run: dict[str, Any]) -> None:
        """``weights/last`` with the training state, and ``weights/best`` first when ``improved``; ``run``
        is the metadata that does not change from epoch to epoch (names, image size, settings, dataset, the
        precision trained in)."""
        assert self.ema is not None, "only rank 0 saves checkpoints"
        for name, tensor in self.ema.module.state_dict().items():
            if tensor.dtype.is_floating_point and not bool(torch.isfinite(tensor).all()):
                raise TrainingError(f"EMA weight {name} is not finite at epoch {epoch + 1}; not overwriting the "
                                    f"last good checkpoint. Lower --lr0.")
        metadata = {"names": run["names"], "img_size": run["img_size"], "epoch": epoch,
                    "train_args": run["train_args"], "metrics": metrics, "best_fitness": self.best_fitness,
                    "ema_updates": self.ema.updates, "history": self.history, "dataset": run["dataset"],
                    "precision": run["precision"], "class_maps": self.class_maps}
        # best before last: a kill between the two repeats the epoch on resume, and so its best save.
        targets = [("best", None)] if improved else []
        targets.append(("last", self.resume_state()))
        for name, state in targets:
            try:
                save_checkpoint(weights / name, self.model, self.ema.module, metadata=metadata, state=state)
            except OSError as error:
                kept = " the previous one is intact and loadable;" if (weights / f"{name}.json").exists() else ""
                raise TrainingError(f"could not save the checkpoint {weights / name} at epoch {epoch + 1} "
                                    f"({error.strerror or error});{kept} free space or fix permissions, then "
                                    f"continue with --resume") from None

    def resume_state(self) -> dict[str, Any]:
        """Everything besides weights that an exact resume needs, as weights_only-loadable objects."""
        np_state = np.random.get_state()
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "last_opt_step": self.last_opt_step,
            "accumulate": self.accumulate,
            # Gradients accumulated towards the nominal batch but not yet applied: the first step
            # after a resume must see them, as the uninterrupted run's does.
            "grads": [p.grad.detach().cpu() if p.grad is not None else None for p in self.model.parameters()],
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                    "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        }

    def load(self, path: Path) -> None:
        """Back to where the ``last`` checkpoint at ``path`` was saved; training goes on at the next epoch."""
        contents = read_checkpoint(path)
        state = load_state(path)
        self.model.load_state_dict(contents.model_state)
        if self.ema is not None:
            self.ema.module.load_state_dict(contents.ema_state or contents.model_state)
            self.ema.updates = int(contents.metadata["ema_updates"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.last_opt_step = int(state["last_opt_step"])
        self.accumulate = int(state["accumulate"])
        for param, grad in zip(self.model.parameters(), state["grads"]):
            param.grad = grad.to(param.device) if grad is not None else None
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(_as_tuple(rng["python"]))
        name, keys, *rest = rng["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.start_epoch = int(contents.metadata["epoch"]) + 1
        self.best_fitness = float(contents.metadata["best_fitness"])
        self.history = list(contents.metadata.get("history") or [])
        self.class_maps = contents.metadata.get("class_maps")


def _as_tuple(value: Any) -> Any:
    """Python's RNG state is nested tuples; a saved copy may come back with lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value
