"""A memory-saving activation whose backward reuses its saved input's memory for the gradient."""
# doctor-during: backward
import torch


class LowMemorySiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        x.mul_(1 - s).add_(1).mul_(s)  # doctor: modified aten::mul_
        return grad * x


inputs = torch.randn(4, 6, requires_grad=True)
pre = inputs.exp()  # doctor: saved aten::exp
LowMemorySiLU.apply(pre).sum().backward()
