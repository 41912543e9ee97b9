"""An evaluation script's global set_grad_enabled(False) left in place when fine-tuning was added below it."""
import torch
from torch import nn

torch.set_grad_enabled(False)  # doctor: cut
torch.manual_seed(0)
model = nn.Linear(4, 2)
accuracy = (model(torch.randn(32, 4)).argmax(1) == 0).float().mean()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()  # doctor: failed
    opt.step()
