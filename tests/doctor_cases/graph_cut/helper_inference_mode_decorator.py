"""A predictor class whose scoring method is decorated with @torch.inference_mode(), reused to compute a loss."""
import torch
from torch import nn


class Scorer:
    def __init__(self, model):
        self.model = model

    @torch.inference_mode()  # doctor: cut
    def score(self, x):
        return self.model(x).squeeze(1)


torch.manual_seed(0)
model = nn.Linear(6, 1)
scorer = Scorer(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(3):
    x, y = torch.randn(16, 6), torch.randn(16)
    scores = scorer.score(x)
    loss = nn.functional.mse_loss(scores, y)
    opt.zero_grad()
    loss.backward()  # doctor: failed
    opt.step()
