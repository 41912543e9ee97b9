"""InfoNCE: the similarity matrix is wrapped in torch.tensor(), which copies it off the graph."""
import warnings

import torch
from torch import nn

warnings.simplefilter("ignore", UserWarning)
torch.manual_seed(0)
encoder = nn.Linear(12, 8)
opt = torch.optim.SGD(encoder.parameters(), lr=0.1)
view1, view2 = torch.randn(6, 12), torch.randn(6, 12)
z1 = nn.functional.normalize(encoder(view1), dim=1)
z2 = nn.functional.normalize(encoder(view2), dim=1)
similarity = torch.tensor(z1 @ z2.T / 0.1)  # doctor: cut
loss = nn.functional.cross_entropy(similarity, torch.arange(6))
loss.backward()  # doctor: failed
opt.step()
