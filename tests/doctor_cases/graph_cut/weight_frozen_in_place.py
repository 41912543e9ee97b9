"""A linear model's weight frozen with requires_grad_(False) (copied from a fine-tuning recipe) while it is the only thing trained."""
import torch

torch.manual_seed(0)
weight = torch.zeros(4, 1, requires_grad=True)
opt = torch.optim.SGD([weight], lr=0.1)
weight.requires_grad_(False)  # doctor: cut
for step in range(3):
    x = torch.randn(16, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    loss = (x @ weight - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()  # doctor: failed
    opt.step()
