"""A text classifier zeroes its padding embedding by assigning into the weight."""
# doctor-fix: no_grad
import torch
from torch import nn

torch.manual_seed(0)
PAD = 0
emb = nn.Embedding(50, 16)  # doctor: made
emb.weight[PAD] = 0  # doctor: written
head = nn.Linear(16, 3)
tokens = torch.randint(0, 50, (4, 7))
logits = head(emb(tokens).mean(1))
nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 1])).backward()
