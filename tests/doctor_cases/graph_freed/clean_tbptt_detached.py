"""Truncated BPTT done right: the state is detached at each segment boundary."""
import torch
from torch import nn

torch.manual_seed(0)
cell = nn.GRUCell(4, 8)
opt = torch.optim.SGD(cell.parameters(), lr=0.1)
h = torch.zeros(2, 8)
center = torch.zeros(8)
for step in range(3):
    h = cell(torch.randn(2, 4), h.detach())
    center = 0.9 * center + 0.1 * h.mean(0).detach()
    loss = (h - center).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
