"""Optimizer-in-backward (a step per parameter from a post-accumulate-grad hook) with two losses on one graph."""
# doctor-during: backward
import torch
from torch import nn

torch.manual_seed(0)
trunk = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh())
heads = nn.ModuleList([nn.Linear(8, 1), nn.Linear(8, 1)])
optimizers = {p: torch.optim.SGD([p], lr=0.1) for p in [*trunk.parameters(), *heads.parameters()]}


def step_now(param: torch.Tensor) -> None:
    optimizers[param].step()  # doctor: modified aten::add_
    optimizers[param].zero_grad()


for param in optimizers:
    param.register_post_accumulate_grad_hook(step_now)

features = trunk(torch.randn(4, 6))  # doctor: saved aten::addmm
loss_a = heads[0](features).pow(2).mean()
loss_b = heads[1](features).abs().mean()
loss_a.backward(retain_graph=True)
loss_b.backward()
