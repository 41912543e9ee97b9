"""Two backward passes through one graph, the first with retain_graph=True, and autograd.grad after it."""
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
x = torch.randn(5, 4, requires_grad=True)
out = net(x)
out[:, 0].sum().backward(retain_graph=True)
(grad_x,) = torch.autograd.grad(out[:, 1].sum(), x, retain_graph=True)
out.pow(2).sum().backward()
features = net[0](x)
features.sum().backward()
(features.detach() * 2).sum()
