"""Hand-written SGD and weight clipping under no_grad, a padding row zeroed under no_grad: nothing to report."""
import torch
from torch import nn

torch.manual_seed(0)
emb = nn.Embedding(20, 4)
with torch.no_grad():
    emb.weight[0] = 0
w = torch.zeros(4, 1, requires_grad=True)
for step in range(3):
    loss = (emb(torch.randint(0, 20, (8,))) @ w).pow(2).mean() + (w - 1).pow(2).sum()
    loss.backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
        for p in emb.parameters():
            p.clamp_(-0.5, 0.5)
    w.grad.zero_()
