"""A GAN step where the discriminator loss uses the generator's output without detaching it."""
# doctor-fix: retain_graph
import torch
from torch import nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6))
D = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
bce = nn.BCEWithLogitsLoss()
for _ in range(2):
    real, fake = torch.randn(16, 6), G(torch.randn(16, 4))
    loss_d = bce(D(real), torch.ones(16, 1)) + bce(D(fake), torch.zeros(16, 1))
    opt_d.zero_grad()
    loss_d.backward()  # doctor: freed
    opt_d.step()
    loss_g = bce(D(fake), torch.ones(16, 1))  # doctor: carried
    opt_g.zero_grad()
    loss_g.backward()  # doctor: failed
    opt_g.step()
