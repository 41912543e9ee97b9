"""Pose estimation regressing each keypoint's column as its heatmap row's argmax, which has no gradient."""
# doctor-options: --verify-fix
# (its fix, the soft-argmax, is a candidate the doctor proposes only once a run verified it)
import torch
from torch import nn

torch.manual_seed(0)
head = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 4, 1))
opt = torch.optim.Adam(head.parameters(), lr=1e-3)
for _step in range(2):
    features, columns = torch.randn(2, 8, 12, 12), torch.randint(0, 12, (2, 4)).float()
    heatmaps = head(features).mean(2)  # [batch, keypoints, width]: each keypoint's column profile
    predicted = heatmaps.argmax(-1).float()  # doctor: cut
    loss = nn.functional.smooth_l1_loss(predicted, columns)
    opt.zero_grad()
    loss.backward()  # doctor: failed
    opt.step()
