"""A frozen backbone under no_grad with a trainable head: nothing to report."""
import torch
from torch import nn

torch.manual_seed(0)
backbone, head = nn.Linear(6, 16), nn.Linear(16, 2)
backbone.requires_grad_(False)
opt = torch.optim.SGD(head.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(8, 6), torch.randint(0, 2, (8,))
    with torch.no_grad():
        features = backbone(x).relu()
    loss = nn.functional.cross_entropy(head(features), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
