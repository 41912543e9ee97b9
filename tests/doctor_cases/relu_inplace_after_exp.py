"""An `inplace=True` activation applied to the output of exp, which exp saved."""
import torch
from torch import nn


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x)
        return self.act(y - 1.5)


class ScaleBad(Scale):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x)  # doctor: saved aten::exp
        return self.act(y)  # doctor: modified aten::relu_


x = torch.randn(3, 5, requires_grad=True)
print("first module is fine:", Scale()(x).sum().item() >= 0)
model = ScaleBad()
model(x).sum().backward()
