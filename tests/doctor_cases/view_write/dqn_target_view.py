"""Dueling DQN: the state value (column 0) is sliced from the online output under no_grad, then zeroed in place at terminal states."""
# doctor-fix: clone
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
gamma = 0.99
for step in range(3):
    s, s_next = torch.randn(16, 4), torch.randn(16, 4)
    action, reward, done = torch.randint(0, 2, (16,)), torch.randn(16), torch.rand(16) < 0.1
    q_next = net(s_next)  # column 0: V(s), then one advantage per action
    with torch.no_grad():
        bootstrap = q_next[:, 0]  # doctor: made
    bootstrap[done] = 0  # doctor: written
    target = reward + gamma * bootstrap
    q = net(s).gather(1, 1 + action[:, None]).squeeze(1)
    loss = nn.functional.smooth_l1_loss(q, target)
    opt.zero_grad()
    loss.backward()
    opt.step()
