"""REINFORCE: the log-probabilities of the sampled actions are detached together with the advantages."""
import torch
from torch import nn

torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
states, rewards = torch.randn(10, 4), torch.randn(10)
dist = torch.distributions.Categorical(logits=policy(states))
actions = dist.sample()
log_probs = dist.log_prob(actions).detach()  # doctor: cut
advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
loss = -(log_probs * advantages).mean()
opt.zero_grad()
loss.backward()  # doctor: failed
opt.step()
