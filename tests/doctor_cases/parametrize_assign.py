"""A positive-weight layer (weight = softplus(original)) is re-projected by assigning `layer.weight`
between the forward and its backward: the assignment makes the parametrization write `original`,
which softplus saved."""
import torch
from torch import nn
from torch.nn.utils import parametrize


class Positive(nn.Module):
    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        return nn.functional.softplus(raw)  # doctor: saved aten::softplus

    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.expm1().log()


torch.manual_seed(0)
layer = nn.Linear(4, 3)
nn.init.uniform_(layer.weight, 0.1, 1.0)  # positive, so right_inverse (log of expm1) is finite
parametrize.register_parametrization(layer, "weight", Positive())
loss = layer(torch.randn(8, 4)).pow(2).mean()
layer.weight = layer.weight.clamp(max=1.0)  # doctor: modified aten::set_
loss.backward()
