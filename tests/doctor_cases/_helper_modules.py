"""Modules imported by helper_module_mutation.py (kept in another file on purpose)."""
import torch
from torch import nn


class Standardise(nn.Module):
    """Subtracts the mean in place: harmless after conv, fatal after sigmoid."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.sub_(x.mean(dim=1, keepdim=True))  # doctor: modified aten::sub_
        return x
