"""A2C with a recurrent policy: the LSTMCell's state goes from one environment step to the next, updated every step."""
import torch
from torch import nn


class Policy(nn.Module):
    def __init__(self, observations, actions, width):
        super().__init__()
        self.cell = nn.LSTMCell(observations, width)
        self.actor = nn.Linear(width, actions)
        self.critic = nn.Linear(width, 1)

    def forward(self, observation, state):
        h, c = self.cell(observation, state)  # doctor: carried
        return self.actor(h), self.critic(h).squeeze(1), (h, c)


torch.manual_seed(0)
policy = Policy(6, 3, 16)
opt = torch.optim.Adam(policy.parameters(), lr=3e-4)
state = (torch.zeros(2, 16), torch.zeros(2, 16))
observation = torch.randn(2, 6)
for _step in range(3):
    logits, value, state = policy(observation, state)  # doctor: passed
    dist = torch.distributions.Categorical(logits=logits)
    action = dist.sample()
    observation, reward = torch.randn(2, 6), (action == 1).float()
    advantage = reward - value
    loss = -(dist.log_prob(action) * advantage.detach()).mean() + advantage.pow(2).mean()
    opt.zero_grad()
    loss.backward()  # doctor: freed failed
    opt.step()
