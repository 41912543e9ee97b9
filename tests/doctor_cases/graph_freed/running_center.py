"""Self-distillation with a centred teacher: the running centre is updated from outputs that carry a graph."""
# doctor-fix: detach
import torch
from torch import nn

torch.manual_seed(0)
student = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 8))
teacher = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 8))
opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
center = torch.zeros(8)
for step in range(3):
    x = torch.randn(16, 6)
    out = student(x)
    with torch.no_grad():
        target = teacher(x).softmax(-1)
    center = 0.9 * center + 0.1 * out.mean(0)  # doctor: carried
    loss = -(target * (out - center).log_softmax(-1)).sum(-1).mean()
    opt.zero_grad()
    loss.backward()  # doctor: freed failed
    opt.step()
