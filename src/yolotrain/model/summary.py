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


def layer_table(model: nn.Module, img_size: int, in_channels: int = 3) -> str:
    """One row per layer of ``model``'s network, as the reference's ``parse_model`` lists them: its index, the
    layers it reads (``from``: -1 the previous one), its parameters, its module type and the shape of its output
    for one ``img_size`` square image (a list of shapes for a head's outputs). A YOLOv5's layers are its numbered
    ones; a classifier's are the top-level modules of its network."""
    container = getattr(model, "model", model)
    layers = list(container.children())
    sources = getattr(model, "layer_inputs", None) or [-1] * len(layers)
    shapes: dict[int, str] = {}

    def recorder(index: int):
        def record(module: nn.Module, inputs: object, output: object) -> None:
            described = [list(t.shape) for t in _tensors(output)]
            shapes[index] = str(described[0] if len(described) == 1 else described)
        return record

    hooks = [layer.register_forward_hook(recorder(i)) for i, layer in enumerate(layers)]
    first = next(model.parameters())
    training = model.training
    model.eval()
    try:
        with torch.enable_grad():  # a YOLOv5 without autograd decodes from its head's inputs, past the head
            model(torch.zeros(1, in_channels, img_size, img_size, device=first.device, dtype=first.dtype))
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    rows = [f"{'':>3}{'from':>14}{'params':>12}  {'module':<28}output"]
    for i, (layer, source) in enumerate(zip(layers, sources)):
        params = sum(p.numel() for p in layer.parameters())
        # The previous layer is -1, as model YAMLs write it.
        inputs = [-1 if j == i - 1 else j for j in source] if isinstance(source, list) else (
            -1 if source == i - 1 else source)
        rows.append(f"{i:>3}{str(inputs):>14}{params:>12,}  {type(layer).__name__:<28}{shapes.get(i, '-')}")
    return "\n".join(rows)


def _tensors(output: object) -> list[torch.Tensor]:
    """The tensors of a layer's output, in order (a head's may be nested lists and tuples)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (list, tuple)):
        return [t for part in output for t in _tensors(part)]
    return []
