"""Linear regression with a learning rate far too large: the weights grow until they overflow."""
# doctor-options: --verify-fix
# (its fix is a candidate the doctor proposes only once a run verified it)
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=5.0)
x = torch.randn(64, 4) * 10
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
for epoch in range(200):
    loss = nn.functional.mse_loss(model(x), y)  # doctor: first mse_loss forward linear
    opt.zero_grad()
    loss.backward()
    opt.step()
