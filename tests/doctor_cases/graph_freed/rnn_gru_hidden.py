"""A GRU cell trained on a stream, one step per batch: the hidden state keeps the previous step's graph."""
# doctor-fix: detach
import torch
from torch import nn

torch.manual_seed(0)
cell = nn.GRUCell(4, 8)
head = nn.Linear(8, 1)
opt = torch.optim.Adam([*cell.parameters(), *head.parameters()], lr=1e-3)
h = torch.zeros(2, 8)
for step in range(3):
    x, y = torch.randn(2, 4), torch.randn(2, 1)
    h = cell(x, h)  # doctor: carried
    loss = nn.functional.mse_loss(head(h), y)
    opt.zero_grad()
    loss.backward()  # doctor: freed failed
    opt.step()
