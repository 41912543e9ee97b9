"""Knowledge distillation under bfloat16 autocast: the student's forward slipped into the teacher's no_grad block."""
import torch
from torch import nn

torch.manual_seed(0)
teacher = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 5))
student = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5))
opt = torch.optim.SGD(student.parameters(), lr=0.05)
x = torch.randn(16, 6)
with torch.autocast("cpu", dtype=torch.bfloat16):
    with torch.no_grad():
        soft_targets = teacher(x).float().softmax(-1)
        student_logits = student(x).float()  # doctor: cut
    loss = nn.functional.kl_div(student_logits.log_softmax(-1), soft_targets, reduction="batchmean")
loss.backward()  # doctor: failed
opt.step()
