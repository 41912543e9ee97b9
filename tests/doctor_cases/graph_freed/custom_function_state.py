"""A recurrent controller whose state passes through a custom gradient-clipping autograd.Function."""
# doctor-fix: detach
import torch


class ClipGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.clamp(-1, 1)


torch.manual_seed(0)
w = torch.randn(6, 6, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.01)
state = torch.randn(3, 6)
for step in range(3):
    state = ClipGrad.apply(torch.sigmoid(state @ w))  # doctor: carried
    loss = (state - 0.5).pow(2).sum()
    opt.zero_grad()
    loss.backward()  # doctor: freed failed
    opt.step()
