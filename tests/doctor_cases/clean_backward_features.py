"""Correct uses of everything that writes during backward or off the main thread: nothing to report."""
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class ScaledSiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        local = s.clone()
        local.mul_(1 + x * (1 - s))  # in place on its own fresh tensor
        return grad * local


torch.manual_seed(0)
body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
optimizers = {p: torch.optim.SGD([p], lr=0.01) for p in head.parameters()}


def step_now(param: torch.Tensor) -> None:
    optimizers[param].step()
    optimizers[param].zero_grad()


for param in head.parameters():
    param.register_post_accumulate_grad_hook(step_now)
saved_grads = []
head.register_full_backward_hook(lambda m, gin, gout: saved_grads.append(gout[0].detach().clone()))
images = torch.randn(2, 3, 8, 8)
for _ in range(2):
    features = checkpoint(body, images, use_reentrant=False)
    features.register_hook(lambda g: g.clamp(-1, 1))  # returns a new gradient
    features = ScaledSiLU.apply(features)
    with ThreadPoolExecutor(max_workers=2) as pool:  # workers compute out of place, and write only their own tensors
        stats = list(pool.map(lambda t: t.detach().mean().add_(1), features.unbind(0)))
    loss = head(features).logsumexp(-1).mean() + sum(stats) * 0
    (grad_images,) = torch.autograd.grad(loss, body[0].weight, retain_graph=True)
    loss.backward()
worker = threading.Thread(target=lambda: torch.ones(3).mul_(2))
worker.start()
worker.join()
