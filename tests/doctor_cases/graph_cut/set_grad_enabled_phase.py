"""A train/val loop sharing one step under set_grad_enabled(training), with the flag set the wrong way."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
training = False
for step in range(3):
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    with torch.set_grad_enabled(training):
        prediction = model(x)  # doctor: cut
    loss = (prediction - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()  # doctor: failed
    opt.step()
