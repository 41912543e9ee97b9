"""A training step copied from the validation loop keeps its no_grad block around the forward pass."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with torch.no_grad():
        logits = model(x)  # doctor: cut
    loss = nn.functional.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()  # doctor: failed
    opt.step()
