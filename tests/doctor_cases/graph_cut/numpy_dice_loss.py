"""A segmentation Dice loss computed on NumPy copies of the predicted probabilities."""
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Conv2d(3, 1, 3, padding=1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
image, mask = torch.randn(2, 3, 8, 8), (torch.rand(2, 1, 8, 8) > 0.5).float()
probs = torch.from_numpy(net(image).sigmoid().detach().cpu().numpy())  # doctor: cut
inter = (probs * mask).sum()
dice = 1 - 2 * inter / (probs.sum() + mask.sum() + 1e-6)
opt.zero_grad()
dice.backward()  # doctor: failed
opt.step()
