"""WGAN-style weight clipping through `.data` between forward and backward.

`.data` writes do not bump the version counter, so PyTorch raises nothing and the
backward silently uses the clipped weights. Run with `--check` to see it.
"""
# doctor-mode: check
import torch
from torch import nn

torch.manual_seed(0)
critic = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
score = critic(torch.randn(8, 6)).mean()  # doctor: saved aten::addmm
for p in critic.parameters():
    p.data.clamp_(-0.01, 0.01)  # doctor: modified aten::clamp_
score.backward()
print("backward finished without error")
