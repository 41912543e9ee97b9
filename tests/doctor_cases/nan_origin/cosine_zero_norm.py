"""Contrastive embeddings normalised by their norm, where padded rows are all zeros."""
import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 4, bias=False))
opt = torch.optim.Adam(encoder.parameters(), lr=1e-3)
batch = torch.randn(6, 8)
batch[4:] = 0  # padding rows
features = encoder(batch)
embeddings = features / features.norm(dim=1, keepdim=True)  # doctor: forward div
similarity = embeddings @ embeddings.T / 0.1
loss = nn.functional.cross_entropy(similarity, torch.arange(6))
opt.zero_grad()
loss.backward()
opt.step()
