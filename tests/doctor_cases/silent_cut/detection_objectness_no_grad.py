"""A detection head whose objectness branch runs under no_grad (copied from target assignment); only boxes train."""
import torch
from torch import nn

torch.manual_seed(0)
neck = nn.Conv2d(3, 16, 3, padding=1)
box_head, objectness_head = nn.Conv2d(16, 4, 1), nn.Conv2d(16, 1, 1)
params = [*neck.parameters(), *box_head.parameters(), *objectness_head.parameters()]
opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
for _step in range(3):
    images = torch.randn(2, 3, 8, 8)
    target_boxes, target_objectness = torch.rand(2, 4, 8, 8), (torch.rand(2, 1, 8, 8) > 0.9).float()
    features = neck(images)
    boxes = box_head(features).sigmoid()
    with torch.no_grad():
        objectness = objectness_head(features)  # doctor: cut
    positive = target_objectness.bool().expand_as(boxes)
    box_loss = (boxes - target_boxes).abs()[positive].sum() / positive.sum().clamp(min=1)
    objectness_loss = nn.functional.binary_cross_entropy_with_logits(objectness, target_objectness)
    loss = box_loss + objectness_loss
    opt.zero_grad()
    loss.backward()
    opt.step()
