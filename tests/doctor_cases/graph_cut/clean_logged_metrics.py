"""Losses logged with .item(), targets detached, evaluation under no_grad: nothing to report."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(5, 1)
target_model = nn.Linear(5, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
history = []
for step in range(3):
    x = torch.randn(8, 5)
    target = target_model(x).detach()
    loss = nn.functional.mse_loss(model(x), target)
    history.append(loss.item())
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.no_grad():
    val = nn.functional.mse_loss(model(x), target).item()
