"""A gradient-penalty style term with the norm written as a power: rows of zeros give 0 ** 0.5."""
import torch
from torch import nn

torch.manual_seed(0)
critic = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3, bias=False))
opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
samples = torch.cat([torch.randn(6, 4), -10 * torch.ones(2, 4)])
with torch.no_grad():
    critic[0].bias.fill_(-1.0)
features = critic(samples)
magnitude = (features**2).sum(-1) ** 0.5  # doctor: backward PowBackward0
loss = (magnitude - 1).pow(2).mean()
opt.zero_grad()
loss.backward()
opt.step()
