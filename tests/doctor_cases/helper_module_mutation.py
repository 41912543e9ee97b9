"""A helper module from another file mutates the sigmoid output it receives."""
# doctor-files: _helper_modules.py
import torch
from torch import nn

from _helper_modules import Standardise


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.norm = Standardise()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.fc(x).sigmoid()  # doctor: saved aten::sigmoid
        return self.norm(gate)


Head()(torch.randn(3, 6)).pow(2).sum().backward()
