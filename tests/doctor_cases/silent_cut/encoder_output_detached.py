"""An autoencoder's latent detached before the classifier head (meant only for the logged copy)."""
import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Linear(10, 4)
classifier = nn.Linear(4, 2)
opt = torch.optim.Adam([*encoder.parameters(), *classifier.parameters()], lr=1e-3)
for step in range(3):
    x, y = torch.randn(16, 10), torch.randint(0, 2, (16,))
    latent = encoder(x).detach()  # doctor: cut
    loss = nn.functional.cross_entropy(classifier(latent), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
