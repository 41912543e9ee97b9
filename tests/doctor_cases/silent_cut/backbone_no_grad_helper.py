"""Features from a trainable backbone computed by a helper decorated with @torch.no_grad() (written for
evaluation): the head trains, the backbone silently never does."""
import torch
from torch import nn


@torch.no_grad()  # doctor: cut
def extract(backbone, x):
    return backbone(x)


torch.manual_seed(0)
backbone = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
head = nn.Linear(16, 3)
opt = torch.optim.SGD([*backbone.parameters(), *head.parameters()], lr=0.1)
for step in range(3):
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    loss = nn.functional.cross_entropy(head(extract(backbone, x)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
