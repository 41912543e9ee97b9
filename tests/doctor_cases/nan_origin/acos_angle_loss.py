"""An angular loss on unit vectors: acos of a cosine that reaches exactly 1."""
import torch
from torch import nn

torch.manual_seed(0)
rotation = nn.Linear(3, 3, bias=False)
with torch.no_grad():
    rotation.weight.copy_(torch.eye(3))
opt = torch.optim.SGD(rotation.parameters(), lr=0.1)
targets = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
predicted = rotation(targets)
cosine = (predicted * targets).sum(1)
angle = torch.acos(cosine)  # doctor: backward AcosBackward0
loss = angle.mean()
opt.zero_grad()
loss.backward()
opt.step()
