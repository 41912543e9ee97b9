"""Exponential moving average of model weights, used for validation and saving (as the reference does)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from ..settings import setting


@dataclass(frozen=True)
class EMAConfig:
    """The weight average that is validated and saved (the reference's values)."""

    decay: float = setting(0.9999, "EMA decay once ramped up", flags=("--ema-decay",), above=0, max=1)
    tau: float = setting(2000.0, "updates over which the decay ramps up", flags=("--ema-tau",), above=0)


class ModelEMA:
    """Keeps ``ema = d·ema + (1-d)·model`` with ``d`` ramping up to ``decay`` over ``tau`` updates.

    The ramp lets the average follow the fast early changes instead of being anchored at the
    random initialisation.
    """

    def __init__(self, model: nn.Module, decay: float = EMAConfig.decay, tau: float = EMAConfig.tau,
                 updates: int = 0) -> None:
        self.module = copy.deepcopy(_unwrap(model)).eval()
        self.decay = decay
        self.tau = tau
        self.updates = updates
        for p in self.module.parameters():
            p.requires_grad_(False)

    def current_decay(self) -> float:
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = self.current_decay()
        ema_state = self.module.state_dict()
        model_state = _unwrap(model).state_dict()
        floats = [k for k, v in ema_state.items() if v.dtype.is_floating_point]
        torch._foreach_lerp_([ema_state[k] for k in floats], [model_state[k].detach() for k in floats], 1.0 - d)


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel, or the model itself."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
