"""A log-determinant term on predicted 3x3 matrices, some of which have a negative determinant."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 9)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    x = torch.randn(16, 4)
    matrices = model(x).view(16, 3, 3)
    loss = -torch.logdet(matrices).mean()  # doctor: forward logdet
    opt.zero_grad()
    loss.backward()
    opt.step()
