"""The epoch's loss is accumulated as a Python number for logging and then back-propagated."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(5, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [(torch.randn(8, 5), torch.randn(8, 1)) for _ in range(4)]
total = 0.0
for x, y in batches:
    batch_loss = nn.functional.mse_loss(model(x), y)
    total += batch_loss.item()  # doctor: cut
loss = torch.tensor(total / len(batches))  # doctor: cut
opt.zero_grad()
loss.backward()  # doctor: failed
opt.step()
