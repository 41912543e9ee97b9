"""One-step actor-critic: the critic's value of the next state is kept for the next update's TD target."""
# doctor-fix: detach
import torch
from torch import nn

torch.manual_seed(0)
critic = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))
actor = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
opt = torch.optim.Adam([*critic.parameters(), *actor.parameters()], lr=1e-3)
gamma = 0.99
state = torch.randn(4)
value = critic(state)
for t in range(3):
    dist = torch.distributions.Categorical(logits=actor(state))
    action = dist.sample()
    next_state, reward = torch.randn(4), float(action) - 0.5
    next_value = critic(next_state)
    advantage = reward + gamma * next_value - value  # doctor: carried
    loss = advantage.pow(2).mean() - dist.log_prob(action) * advantage.detach().squeeze()
    opt.zero_grad()
    loss.backward()  # doctor: freed failed
    opt.step()
    state, value = next_state, next_value
