"""A recurrent memory attended to under bfloat16 autocast; the memory keeps the previous segment's graph."""
# doctor-fix: detach
import torch
from torch import nn

torch.manual_seed(0)
proj = nn.Linear(8, 8)
opt = torch.optim.SGD(proj.parameters(), lr=0.1)
memory = torch.zeros(4, 8)
for segment in range(3):
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q = proj(x)
        attn = (q @ memory.T).softmax(-1)
        out = q + attn @ memory
    loss = out.float().pow(2).mean()
    opt.zero_grad()
    loss.backward()  # doctor: freed failed
    opt.step()
    memory = out.float()  # doctor: carried
