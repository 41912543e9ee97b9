"""Two in-place ops on column views of a saved tensor: both are reported."""
import torch

x = torch.randn(5, 4, requires_grad=True)
boxes = x.exp()  # doctor: saved aten::exp
boxes[:, 2].clamp_(max=4.0)  # doctor: modified aten::clamp_
boxes[:, 3].mul_(0.5)  # doctor: modified aten::mul_
boxes.sum().backward()
