"""An auxiliary head's saved output is modified in place, but its loss is disabled,
so backward never reaches it and nothing raises. `--check` still reports it."""
# doctor-mode: check
import torch

x = torch.randn(4, 6, requires_grad=True)
main = (x * 2).sum()
aux = x.exp()  # doctor: saved aten::exp
aux.mul_(0.5)  # doctor: modified aten::mul_
use_aux = False
loss = main + aux.sum() if use_aux else main
loss.backward()
print("trained without error")
