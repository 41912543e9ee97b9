"""A custom straight-through quantiser is applied to a detached activation, so nothing reaches the encoder."""
import torch
from torch import nn


class StraightThroughRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.round()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


torch.manual_seed(0)
encoder, decoder = nn.Linear(8, 4), nn.Linear(4, 8)
decoder.requires_grad_(False)
opt = torch.optim.Adam(encoder.parameters(), lr=1e-3)
x = torch.randn(16, 8)
code = StraightThroughRound.apply(encoder(x).detach() * 4)  # doctor: cut
loss = nn.functional.mse_loss(decoder(code / 4), x)
opt.zero_grad()
loss.backward()  # doctor: failed
opt.step()
