"""A classifier trained with log_softmax and a masked attention with -inf: nothing non-finite survives."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 5)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, labels = torch.randn(16, 8), torch.randint(0, 5, (16,))
mask = torch.triu(torch.ones(16, 16, dtype=torch.bool), diagonal=1)
for step in range(3):
    logits = model(x)
    scores = (logits @ logits.T).masked_fill(mask, float("-inf"))
    mixed = scores.softmax(dim=-1) @ logits
    loss = nn.functional.nll_loss(torch.log_softmax(mixed, dim=1), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
