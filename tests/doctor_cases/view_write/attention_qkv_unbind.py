"""Self-attention scales the queries in place after unbinding q, k, v from one projection."""
# doctor-fix: out_of_place
import torch
from torch import nn

torch.manual_seed(0)
heads, dim = 2, 8
qkv_proj = nn.Linear(dim, 3 * dim)
x = torch.randn(2, 5, dim)
qkv = qkv_proj(x).reshape(2, 5, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
q, k, v = qkv.unbind(0)  # doctor: made
q *= (dim // heads) ** -0.5  # doctor: written
out = (q @ k.transpose(-2, -1)).softmax(-1) @ v
out.sum().backward()
