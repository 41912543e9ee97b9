"""WGAN critic: weights clipped after each step with clamp_ on the parameters, outside no_grad."""
# doctor-fix: no_grad
import torch
from torch import nn

torch.manual_seed(0)
critic = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
opt = torch.optim.RMSprop(critic.parameters(), lr=5e-5)
for step in range(3):
    real, fake = torch.randn(8, 4) + 1, torch.randn(8, 4)
    loss = critic(fake).mean() - critic(real).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    for p in critic.parameters():  # doctor: made
        p.clamp_(-0.01, 0.01)  # doctor: written
