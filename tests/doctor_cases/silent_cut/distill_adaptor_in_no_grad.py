"""Feature distillation: the student's adaptor was put in the teacher's no_grad block, so it never trains."""
import torch
from torch import nn

torch.manual_seed(0)
teacher = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16)).requires_grad_(False)
student = nn.Sequential(nn.Linear(10, 8), nn.ReLU())
adaptor, classifier = nn.Linear(8, 16), nn.Linear(8, 3)
modules = (student, adaptor, classifier)
opt = torch.optim.SGD([p for module in modules for p in module.parameters()], lr=0.05)
for _step in range(3):
    x, y = torch.randn(16, 10), torch.randint(0, 3, (16,))
    features = student(x)
    with torch.no_grad():
        teacher_features = teacher(x)
        projected = adaptor(features)  # doctor: cut
    loss = nn.functional.cross_entropy(classifier(features), y) + nn.functional.mse_loss(projected, teacher_features)
    opt.zero_grad()
    loss.backward()
    opt.step()
