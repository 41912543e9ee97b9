"""A signed square root written with torch.where: each branch's sqrt is NaN where it is masked away."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    z = model(x)
    signed_root = torch.where(z >= 0, torch.sqrt(z), -torch.sqrt(-z))  # doctor: forward sqrt
    loss = (signed_root - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
