"""Contrastive learning with a memory bank of past embeddings, enqueued without detach()."""
from collections import deque

import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 8))
opt = torch.optim.SGD(encoder.parameters(), lr=0.05)
memory_bank = deque(maxlen=4)
for _step in range(3):
    view_a, view_b = torch.randn(6, 10), torch.randn(6, 10)
    query = nn.functional.normalize(encoder(view_a), dim=1)
    key = nn.functional.normalize(encoder(view_b), dim=1)
    negatives = torch.cat([key, *memory_bank])  # doctor: carried
    logits = query @ negatives.t() / 0.1
    loss = nn.functional.cross_entropy(logits, torch.arange(len(query)))
    opt.zero_grad()
    loss.backward()  # doctor: freed failed
    opt.step()
    memory_bank.append(key)  # doctor: produced
