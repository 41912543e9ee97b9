"""A custom autograd.Function clamps its input in place inside forward."""
import torch


class ClampGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x.clamp_(min=0.0, max=2.0)  # doctor: modified aten::clamp_
        return x * 2

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


x = torch.randn(5, requires_grad=True)
y = x.exp()  # doctor: saved aten::exp
z = ClampGrad.apply(y)
z.sum().backward()
