"""An exponential margin loss whose exponent grows with unscaled scores."""
import torch
from torch import nn

torch.manual_seed(0)
scorer = nn.Linear(20, 1)
opt = torch.optim.SGD(scorer.parameters(), lr=0.01)
x, y = torch.randn(64, 20) * 30, torch.randint(0, 2, (64,)).float() * 2 - 1
scores = scorer(x).squeeze(1)
loss = torch.exp(-y * scores * 10).mean()  # doctor: first exp backward ExpBackward0
opt.zero_grad()
loss.backward()
opt.step()
