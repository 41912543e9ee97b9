"""A correct GAN step: the discriminator sees `fake.detach()`, the generator a fresh D pass."""
import torch
from torch import nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6))
D = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, foreach=True)
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, foreach=True)
bce = nn.BCEWithLogitsLoss()
for _ in range(2):
    real, fake = torch.randn(16, 6), G(torch.randn(16, 4))
    loss_d = bce(D(real), torch.ones(16, 1)) + bce(D(fake.detach()), torch.zeros(16, 1))
    opt_d.zero_grad()
    loss_d.backward()
    opt_d.step()
    loss_g = bce(D(fake), torch.ones(16, 1))
    opt_g.zero_grad()
    loss_g.backward()
    opt_g.step()
