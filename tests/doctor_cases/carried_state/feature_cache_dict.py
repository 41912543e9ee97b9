"""A linear probe trained on a pretrained backbone's features, cached per image in a dict that keeps their graph."""
import torch
from torch import nn

torch.manual_seed(0)
backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
head = nn.Linear(8, 4)
opt = torch.optim.SGD(head.parameters(), lr=0.01)  # the pretrained backbone only extracts features
images, labels = torch.randn(3, 2, 3, 16, 16), torch.randint(0, 4, (3, 2))
feature_cache = {}
for _epoch in range(2):
    for index in range(len(images)):
        if index not in feature_cache:
            feature_cache[index] = backbone(images[index])  # doctor: produced
        features = feature_cache[index]
        loss = nn.functional.cross_entropy(head(features), labels[index])  # doctor: carried
        opt.zero_grad()
        loss.backward()  # doctor: freed failed
        opt.step()
