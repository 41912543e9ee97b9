"""An entropy regulariser that masks the zero probabilities of a sparse (ReLU-normalised) distribution."""
import torch
from torch import nn

torch.manual_seed(0)
head = nn.Linear(12, 6)
opt = torch.optim.SGD(head.parameters(), lr=0.1)
x = torch.randn(16, 12)
weights = torch.relu(head(x))
p = weights / (weights.sum(1, keepdim=True) + 1e-6)
entropy = -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(1).mean()  # doctor: first log backward MulBackward0
opt.zero_grad()
(-entropy).backward()
opt.step()
