"""Linear regression trained by hand: the update writes into the weight leaf with grad mode on."""
# doctor-fix: no_grad
import torch

torch.manual_seed(0)
x = torch.randn(64, 3)
y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
w = torch.zeros(3, 1, requires_grad=True)  # doctor: made
lr = 0.1
for step in range(5):
    loss = ((x @ w - y) ** 2).mean()
    loss.backward()
    w -= lr * w.grad  # doctor: written
    w.grad.zero_()
