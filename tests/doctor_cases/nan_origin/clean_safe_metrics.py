"""Normalised embeddings with F.normalize and a masked log under no_grad for a metric."""
import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Linear(6, 4)
opt = torch.optim.Adam(encoder.parameters(), lr=1e-3)
batch = torch.randn(8, 6)
batch[6:] = 0
emb = nn.functional.normalize(encoder(batch) * (batch.abs().sum(1, keepdim=True) > 0), dim=1)
loss = (1 - emb @ emb.T).pow(2).mean()
opt.zero_grad()
loss.backward()
opt.step()
with torch.no_grad():
    p = torch.relu(emb).softmax(1) * (emb > 0)
    entropy = -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(1)
assert entropy.isfinite().all() and entropy.mean().item() > 0
