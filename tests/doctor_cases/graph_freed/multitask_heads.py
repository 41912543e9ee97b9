"""Two task heads on one backbone, each loss back-propagated on its own."""
# doctor-fix: retain_graph
import torch
from torch import nn

torch.manual_seed(0)
backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
cls_head, reg_head = nn.Linear(8, 5), nn.Linear(8, 4)
opt = torch.optim.SGD([*backbone.parameters(), *cls_head.parameters(), *reg_head.parameters()], lr=0.01)
images, labels, boxes = torch.randn(4, 3, 16, 16), torch.randint(0, 5, (4,)), torch.rand(4, 4)
opt.zero_grad()
features = backbone(images)
cls_loss = nn.functional.cross_entropy(cls_head(features), labels)
cls_loss.backward()  # doctor: freed
box_loss = nn.functional.l1_loss(reg_head(features), boxes)  # doctor: carried
box_loss.backward()  # doctor: failed
opt.step()
