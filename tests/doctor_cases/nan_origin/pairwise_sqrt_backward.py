"""A triplet-style loss on pairwise Euclidean distances: the diagonal distance is sqrt(0)."""
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Linear(5, 3)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
points, labels = torch.randn(8, 5), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
emb = net(points)
diff = emb[:, None, :] - emb[None, :, :]
dist = diff.pow(2).sum(-1).sqrt()  # doctor: backward SqrtBackward0
same = labels[:, None] == labels[None, :]
loss = (dist * same).mean() - (dist * ~same).clamp(max=2.0).mean()
opt.zero_grad()
loss.backward()
opt.step()
