"""A multi-object tracker's appearance head: each frame's detections are matched to the previous frame's embeddings."""
import torch
from torch import nn

torch.manual_seed(0)
embedder = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 8))
opt = torch.optim.SGD(embedder.parameters(), lr=0.05)
frames = torch.randn(4, 5, 12)  # 4 frames of 5 detected boxes' pooled features, the same objects in order
previous = None
for frame in frames:
    embeddings = nn.functional.normalize(embedder(frame), dim=1)
    if previous is not None:
        similarity = embeddings @ previous.t() / 0.07  # doctor: carried
        loss = nn.functional.cross_entropy(similarity, torch.arange(len(frame)))
        opt.zero_grad()
        loss.backward()  # doctor: freed failed
        opt.step()
    previous = embeddings
