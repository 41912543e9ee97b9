"""A correct training loop: in-place ops only where nothing saved needs the old values."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
    nn.Conv2d(8, 4, 3, padding=1), nn.SiLU(inplace=False), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(2):
    out = model(torch.randn(2, 3, 16, 16))
    probs = out.sigmoid()
    loss = (probs - 0.5).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        for p in model.parameters():
            p.clamp_(-1, 1)
