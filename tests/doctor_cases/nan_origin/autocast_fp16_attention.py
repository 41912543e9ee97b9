"""Unscaled dot-product attention under float16 autocast: the scores overflow 65504."""
# doctor-options: --verify-fix
# (its fix is a candidate the doctor proposes only once a run verified it)
import torch
from torch import nn

torch.manual_seed(0)
proj = nn.Linear(32, 96)
opt = torch.optim.AdamW(proj.parameters(), lr=1e-4)
tokens = torch.randn(2, 10, 32) * 400
with torch.autocast("cpu", dtype=torch.float16):
    q, k, v = proj(tokens).chunk(3, dim=-1)
    scores = q @ k.transpose(-1, -2)  # doctor: first matmul
    attention = scores.softmax(dim=-1)  # doctor: forward softmax
    out = attention @ v
loss = out.float().pow(2).mean()
opt.zero_grad()
loss.backward()
opt.step()
