"""Tied weights with weight decay applied from a module backward hook, before the tied use's backward."""
# doctor-during: backward
import torch
from torch import nn

torch.manual_seed(0)
embed = nn.Embedding(10, 4)
mix = nn.Linear(4, 4)
tokens = torch.randint(0, 10, (3, 5))
hidden = mix(embed(tokens)).tanh()
logits = hidden @ embed.weight.t()  # doctor: saved aten::mm
norm = nn.LayerNorm(10)


def decay_tied_weight(module: nn.Module, grad_input: tuple, grad_output: tuple) -> None:
    with torch.no_grad():
        embed.weight.mul_(0.999)  # doctor: modified aten::mul_


norm.register_full_backward_hook(decay_tied_weight)
norm(logits).logsumexp(-1).mean().backward()
