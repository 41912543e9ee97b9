"""Classic GAN bug: the discriminator steps before the generator's backward, which
still needs the discriminator weights saved during the shared forward pass."""
import torch
from torch import nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6))
D = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, foreach=True)
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, foreach=True)
bce = nn.BCEWithLogitsLoss()

real = torch.randn(16, 6)
fake = G(torch.randn(16, 4))
d_fake = D(fake)  # doctor: saved aten::addmm
loss_d = bce(D(real), torch.ones(16, 1)) + bce(d_fake, torch.zeros(16, 1))
opt_d.zero_grad()
loss_d.backward(retain_graph=True)
opt_d.step()  # doctor: modified aten::_foreach_addcdiv_
loss_g = bce(d_fake, torch.ones(16, 1))
opt_g.zero_grad()
loss_g.backward()
opt_g.step()
