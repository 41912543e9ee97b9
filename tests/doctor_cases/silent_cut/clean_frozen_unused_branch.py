"""A model with an auxiliary branch that is frozen and unused, a head used every other step, and a GAN-style
second optimizer: every trainable parameter that runs gets its gradient, so nothing is reported."""
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)
        self.aux = nn.Linear(8, 3)
        self.aux.requires_grad_(False)
        self.spare = nn.Linear(8, 8)  # trainable, never called
        self.refine = nn.Linear(8, 8)  # called on even steps only

    def forward(self, x, step):
        h = self.body(x).relu()
        if step % 2 == 0:
            h = self.refine(h)
        return self.head(h)


torch.manual_seed(0)
model = Model()
critic = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
critic_opt = torch.optim.SGD(critic.parameters(), lr=0.1)
for step in range(4):
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    logits = model(x, step)
    critic_loss = critic(logits.detach()).pow(2).mean()
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    loss = nn.functional.cross_entropy(logits, y) + critic(logits).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        accuracy = (model(x, step).argmax(1) == y).float().mean()
