"""A feature helper decorated with @torch.no_grad() for evaluation, reused in the training loop."""
import torch
from torch import nn


@torch.no_grad()  # doctor: cut
def embed(model, x):
    return model(x)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    logits = embed(model, x)
    loss = nn.functional.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()  # doctor: failed
    opt.step()
