"""Chunks and unbound views used out of place, a single view of a fresh tensor written in place: nothing to report."""
import torch
from torch import nn

torch.manual_seed(0)
proj = nn.Linear(6, 12)
h = proj(torch.randn(3, 6))
a, b = h.chunk(2, dim=1)
a = a.sigmoid()
q, k = h.view(3, 2, 6).unbind(1)
q = q * 0.5
scaled = h * 1.0
row = scaled[0]
row.mul_(2)
(a * b).sum().add((q @ k.T).sum()).add(scaled.sum()).backward()
