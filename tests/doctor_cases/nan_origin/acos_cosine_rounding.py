"""Angles between normalised directions: the cosine of a vector with itself rounds past 1."""
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Linear(7, 7)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
directions = nn.functional.normalize(torch.randn(64, 7), dim=1)
predicted = nn.functional.normalize(directions + 0 * net(directions), dim=1)
cosine = (predicted * directions).sum(1)
angle = torch.acos(cosine)  # doctor: forward acos
loss = angle.mean()
opt.zero_grad()
loss.backward()
opt.step()
