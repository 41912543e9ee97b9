"""CycleGAN-style image pool: the discriminator also sees generated images of earlier steps, kept with their graph."""
import random

import torch
from torch import nn

torch.manual_seed(0)
random.seed(0)
generator = nn.Sequential(nn.Linear(4, 16), nn.Tanh())
discriminator = nn.Sequential(nn.Linear(16, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
opt_d = torch.optim.Adam(discriminator.parameters(), lr=2e-4)
pool = []
for _step in range(4):
    fake = generator(torch.randn(8, 4))
    pool.append(fake)
    history = random.choice(pool)
    scores = discriminator(torch.cat([torch.randn(8, 16), history]))  # doctor: carried
    labels = torch.cat([torch.ones(8, 1), torch.zeros(8, 1)])
    loss_d = nn.functional.binary_cross_entropy_with_logits(scores, labels)
    opt_d.zero_grad()
    loss_d.backward()  # doctor: freed failed
    opt_d.step()
