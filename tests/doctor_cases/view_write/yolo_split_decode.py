"""Box decoding splits the head output into xy, wh and objectness and squashes xy in place."""
# doctor-fix: out_of_place
import torch
from torch import nn

torch.manual_seed(0)
head = nn.Conv2d(8, 3 * 5, 1)
features = torch.randn(2, 8, 4, 4)
pred = head(features).view(2, 3, 5, 4, 4).permute(0, 1, 3, 4, 2)
xy, wh, obj = pred.split((2, 2, 1), dim=-1)  # doctor: made
xy.sigmoid_()  # doctor: written
boxes = torch.cat((xy * 2 - 0.5, wh.exp(), obj.sigmoid()), -1)
boxes.mean().backward()
