"""The anchor-free keypoint (pose) head (YOLOv8-pose, YOLO11-pose, and YOLOv5u with it): the anchor-free detection
head with a third branch predicting ``K`` keypoints of ``D`` values each (x, y, and with ``D == 3`` a visibility
logit) per cell, as offsets from the cell."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .head import REG_MAX, AnchorFreeDetect, plain_branch

# Keypoints of the COCO person (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles), with visibility.
COCO_KEYPOINT_SHAPE = (17, 3)
MAX_KEYPOINTS = 1000
# Values per keypoint: x, y, or x, y and visibility.
KEYPOINT_DIMENSIONS = (2, 3)


class AnchorFreePose(AnchorFreeDetect):
    """:class:`AnchorFreeDetect` whose cells also predict ``kpt_shape`` = (K, D) keypoint values (``cv4``, after
    the class logits in every map), keypoint-major: x0, y0(, v0), x1, ...

    A keypoint's raw x, y are offsets from the cell's top-left corner in strides, halved: the decoded position is
    ``(2 * raw + cell index) * stride`` pixels, the reference's ``kpts_decode``; a third value is a visibility logit.
    """

    task = "pose"
    model_kind = "pose"

    def __init__(self, num_classes: int, channels: Sequence[int], strides: Sequence[int],
                 kpt_shape: Sequence[int] = COCO_KEYPOINT_SHAPE, reg_max: int = REG_MAX, legacy: bool = True) -> None:
        super().__init__(num_classes, channels, strides, reg_max, legacy)
        keypoints, dimensions = (int(v) for v in kpt_shape)
        if not 1 <= keypoints <= MAX_KEYPOINTS or dimensions not in KEYPOINT_DIMENSIONS:
            raise ValueError(f"kpt_shape must be [keypoints 1..{MAX_KEYPOINTS}, 2 or 3 values each], "
                             f"got {list(kpt_shape)}")
        self.kpt_shape = (keypoints, dimensions)
        self.nk = keypoints * dimensions
        self.no += self.nk
        hidden = max(channels[0] // 4, self.nk)
        self.cv4 = nn.ModuleList(plain_branch(c, hidden, self.nk) for c in channels)

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Raw maps ``[B, 4*reg_max + nc + K*D, H/s, W/s]`` per level: distance logits, class logits, keypoints."""
        return [torch.cat((box(x), cls(x), keypoints(x)), 1)
                for box, cls, keypoints, x in zip(self.cv2, self.cv3, self.cv4, features)]

    def decode(self, maps: list[torch.Tensor]) -> torch.Tensor:
        """Raw maps → ``[B, N, 5 + nc + K*D]``: the detection columns of :meth:`AnchorFreeDetect.decode`, then per
        keypoint x, y in input pixels (and the sigmoid visibility when D == 3)."""
        detection_maps = [p[:, :p.shape[1] - self.nk] for p in maps]
        decoded = super().decode(detection_maps)
        dtype = decoded.dtype
        raw = torch.cat([p[:, p.shape[1] - self.nk:].flatten(2) for p in maps], 2).to(dtype)      # [B, K*D, N]
        keypoints, dimensions = self.kpt_shape
        raw = raw.unflatten(1, (keypoints, dimensions))                                            # [B, K, D, N]
        points, strides = self._anchor_points(maps, dtype)                                         # [1, 2, N]
        xy = (raw[:, :, :2] * 2.0 + (points[:, None] - 0.5)) * strides[:, None]
        columns = torch.cat((xy, raw[:, :, 2:].sigmoid()), 2).flatten(1, 2)                       # [B, K*D, N]
        return torch.cat((decoded, columns.transpose(1, 2)), 2)
