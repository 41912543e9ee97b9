"""A checkpointed block updates a running buffer; recomputing it in autograd.grad updates it again."""
# doctor-during: backward
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class RunningScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.scale.mul_(0.9).add_(0.1 * x.abs().mean())  # doctor: modified aten::mul_
        return x.tanh()


torch.manual_seed(0)
block = RunningScale()
x = torch.randn(4, 3, requires_grad=True)
h = checkpoint(block, x, use_reentrant=False)
out = (h * block.scale).sum()  # doctor: saved aten::mul
(grad_x,) = torch.autograd.grad(out, x, retain_graph=True)
out.backward()
