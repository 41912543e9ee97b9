"""Metric learning with a triplet loss; the anchors' embeddings are read through .data, so the anchor tower gets no gradient."""
import torch
from torch import nn

torch.manual_seed(0)
anchor_tower = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 8))
item_tower = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 8))
opt = torch.optim.SGD([*anchor_tower.parameters(), *item_tower.parameters()], lr=0.05)
triplet = nn.TripletMarginLoss(margin=0.5)
for _step in range(3):
    queries, positives, negatives = torch.randn(3, 12, 10).unbind(0)
    anchors = anchor_tower(queries).data  # doctor: cut
    loss = triplet(anchors, item_tower(positives), item_tower(negatives))
    opt.zero_grad()
    loss.backward()
    opt.step()
