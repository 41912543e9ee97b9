"""A world model rolled forward one step at a time; its latent is passed to the next step's prediction."""
import torch
from torch import nn


class Dynamics(nn.Module):
    def __init__(self, latent, actions):
        super().__init__()
        self.transition = nn.Sequential(nn.Linear(latent + actions, 32), nn.ELU(), nn.Linear(32, latent))
        self.reward = nn.Linear(latent, 1)

    def forward(self, latent, action):
        latent = latent + self.transition(torch.cat([latent, action], dim=1))  # doctor: carried
        return latent, self.reward(latent).squeeze(1)


torch.manual_seed(0)
model = Dynamics(8, 2)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
latent = torch.zeros(4, 8)
for _step in range(3):
    action, reward = torch.randn(4, 2), torch.randn(4)
    latent, predicted = model(latent, action)  # doctor: passed
    loss = nn.functional.mse_loss(predicted, reward)
    opt.zero_grad()
    loss.backward()  # doctor: freed failed
    opt.step()
