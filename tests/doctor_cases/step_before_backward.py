"""Gradient-accumulation bug: the optimiser steps between a forward pass and its backward."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(5, 5), nn.Sigmoid(), nn.Linear(5, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
batches = [torch.randn(4, 5) for _ in range(2)]
pending = model(batches[0]).pow(2).mean()
pending.backward()
loss = model(batches[1]).pow(2).mean()  # doctor: saved aten::addmm
opt.step()  # doctor: modified aten::add_
loss.backward()
