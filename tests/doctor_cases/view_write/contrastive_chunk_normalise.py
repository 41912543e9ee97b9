"""SimCLR-style loss: the two views' embeddings are chunked from one batch and normalised in place."""
# doctor-fix: out_of_place
import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 8))
batch = torch.randn(12, 10)
z = encoder(batch)
z1, z2 = z.chunk(2)  # doctor: made
z1.div_(z1.norm(dim=1, keepdim=True))  # doctor: written
z2 = z2 / z2.norm(dim=1, keepdim=True)
logits = z1 @ z2.T / 0.1
nn.functional.cross_entropy(logits, torch.arange(6)).backward()
