"""Grad-CAM style: a gradient hook weighs the activation it watches in place, which ReLU saved."""
# doctor-during: backward
import torch
from torch import nn

torch.manual_seed(0)
features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
activations = features(torch.randn(1, 3, 8, 8))  # doctor: saved aten::relu


def weigh_by_gradient(grad: torch.Tensor) -> None:
    activations.mul_(grad.mean(dim=(2, 3), keepdim=True))  # doctor: modified aten::mul_


activations.register_hook(weigh_by_gradient)
head(activations)[0, 1].backward()
