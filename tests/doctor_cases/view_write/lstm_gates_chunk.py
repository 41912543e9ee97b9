"""A hand-written LSTM cell applies its gate nonlinearities in place on the chunks of one matmul."""
# doctor-fix: out_of_place
import torch
from torch import nn


class Cell(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.gates = nn.Linear(2 * size, 4 * size)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i, f, g, o = self.gates(torch.cat([x, h], 1)).chunk(4, 1)  # doctor: made
        i.sigmoid_()  # doctor: written
        c = f.sigmoid() * c + i * g.tanh()
        return o.sigmoid() * c.tanh(), c


torch.manual_seed(0)
cell = Cell(6)
h = c = torch.zeros(3, 6)
for x in torch.randn(4, 3, 6):
    h, c = cell(x, h, c)
h.pow(2).mean().backward()
