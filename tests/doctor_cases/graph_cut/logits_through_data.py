"""Logits read through .data (an old idiom for "the values") before the loss."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(6, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    logits = model(x).data  # doctor: cut
    loss = nn.functional.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()  # doctor: failed
    opt.step()
