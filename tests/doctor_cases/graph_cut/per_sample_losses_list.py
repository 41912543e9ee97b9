"""Per-sample YOLO-style box losses collected as Python numbers in a list, then made a tensor."""
import torch
from torch import nn

torch.manual_seed(0)
head = nn.Linear(10, 4)
opt = torch.optim.SGD(head.parameters(), lr=0.01)
features, targets = torch.randn(5, 10), torch.rand(5, 4)
boxes = head(features).sigmoid()
losses = [nn.functional.smooth_l1_loss(box, target).item() for box, target in zip(boxes, targets)]  # doctor: cut
loss = torch.tensor(losses).mean()  # doctor: cut
opt.zero_grad()
loss.backward()  # doctor: failed
opt.step()
