"""A LayerScale block whose reset method fills its scale parameter in place."""
# doctor-fix: no_grad
import torch
from torch import nn


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float = 1e-5) -> None:
        super().__init__()
        self.init = init
        self.gamma = nn.Parameter(torch.empty(dim))  # doctor: made
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.gamma.fill_(self.init)  # doctor: written

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


block = nn.Sequential(nn.Linear(8, 8), LayerScale(8))
block(torch.randn(2, 8)).sum().backward()
