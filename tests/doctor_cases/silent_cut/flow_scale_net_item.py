"""An affine coupling flow whose log-scale clamp reads the scale network through .tolist(), so that network never trains."""
import math

import torch
from torch import nn

torch.manual_seed(0)
scale_net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2))
shift_net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2))
opt = torch.optim.Adam([*scale_net.parameters(), *shift_net.parameters()], lr=1e-3)
for _step in range(3):
    x = torch.randn(32, 4) * 2 + 1
    x_a, x_b = x.chunk(2, dim=1)
    log_scale = torch.tensor(scale_net(x_a).tanh().tolist())  # doctor: cut
    z_b = x_b * log_scale.exp() + shift_net(x_a)
    z = torch.cat([x_a, z_b], dim=1)
    log_likelihood = -0.5 * (z.pow(2) + math.log(2 * math.pi)).sum(1) + log_scale.sum(1)
    loss = -log_likelihood.mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
