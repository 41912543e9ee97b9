"""A model's size in one line, as the reference's ``model_info`` prints it: layers, parameters, gradients
and GFLOPs at the model's default input size."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


class ModelSummary(NamedTuple):
    """``layers``: modules in the network (the reference counts every ``nn.Module`` of it); ``parameters``:
    numbers in its tensors; ``gradients``: those that train (``requires_grad``); ``gflops``: billions of
    floating-point operations of one forward pass on one ``img_size`` square image (a multiply-add counts
    two, as the reference counts them)."""

    name: str
    layers: int
    parameters: int
    gradients: int
    gflops: float
    img_size: int

    def __str__(self) -> str:
        return (f"{self.name} summary: {self.layers} layers, {self.parameters:,} parameters, "
                f"{self.gradients:,} gradients, {self.gflops:.1f} GFLOPs at {self.img_size}x{self.img_size}")


def summarise(model: nn.Module, name: str, img_size: int, in_channels: int = 3) -> ModelSummary:
    """The :class:`ModelSummary` of ``model``. The FLOPs are counted by PyTorch's operator counter over one
    forward pass (no gradients) in eval mode; the model's mode is restored after."""
    parameters = list(model.parameters())
    first = parameters[0]
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, in_channels, img_size, img_size, device=first.device, dtype=first.dtype))
    finally:
        model.train(training)
    return ModelSummary(name, sum(1 for _ in model.modules()), sum(p.numel() for p in parameters),
                        sum(p.numel() for p in parameters if p.requires_grad), counter.get_total_flops() / 1e9,
                        img_size)
