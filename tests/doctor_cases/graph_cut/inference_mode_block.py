"""A training step whose forward pass sits in an inference_mode block copied from the serving code."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(3):
    x, y = torch.randn(8, 5), torch.randint(0, 2, (8,))
    with torch.inference_mode():
        logits = model(x)  # doctor: cut
    loss = nn.functional.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()  # doctor: failed
    opt.step()
