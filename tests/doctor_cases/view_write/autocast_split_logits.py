"""Mixed precision: a two-headed output under bfloat16 autocast is split and its first head masked in place."""
# doctor-fix: clone
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(6, 10)
x, mask = torch.randn(4, 6), torch.rand(4, 4) > 0.5
with torch.autocast("cpu", dtype=torch.bfloat16):
    cls_logits, reg = model(x).split([4, 6], dim=1)  # doctor: made
    cls_logits[mask] = -1e4  # doctor: written
    loss = cls_logits.float().logsumexp(1).mean() + reg.float().pow(2).mean()
loss.backward()
