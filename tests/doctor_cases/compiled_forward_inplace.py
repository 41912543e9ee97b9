"""A torch.compile'd model (eager backend) scales an activation in place after sigmoid saved it."""
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.proj(x).sigmoid()  # doctor: saved aten::sigmoid
        gate.mul_(2)  # doctor: modified aten::mul_
        return self.out(gate)


torch.manual_seed(0)
model = torch.compile(Gate(), backend="eager")
model(torch.randn(3, 4)).sum().backward()
