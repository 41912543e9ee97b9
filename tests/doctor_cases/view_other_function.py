"""A helper function clamps a flattened view of a saved tensor."""
import torch


def normalise_(flat: torch.Tensor) -> None:
    flat.clamp_(max=0.9)  # doctor: modified aten::clamp_


def score(x: torch.Tensor) -> torch.Tensor:
    s = x.sigmoid()  # doctor: saved aten::sigmoid
    normalise_(s.view(-1))
    return s


x = torch.randn(3, 4, requires_grad=True)
score(x).sum().backward()
