"""The anchor-free oriented-box head (YOLOv8-obb, YOLO11-obb, YOLOv5u-obb): the anchor-free detection head with a
third branch predicting each box's rotation, the box's four distances measured along its own rotated axes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .head import REG_MAX, AnchorFreeDetect, plain_branch

NUM_ANGLES = 1  # rotation outputs per prediction (the reference's ne)


def angle_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """The reference's rotation of a box from its angle logit: ``(sigmoid - 1/4) * pi``, in [-pi/4, 3pi/4)."""
    return (logits.sigmoid() - 0.25) * math.pi


class AnchorFreeOBB(AnchorFreeDetect):
    """:class:`AnchorFreeDetect` whose cells also predict a rotation logit (``cv4``, after the class logits in every
    map). The distances are measured along the rotated box's axes: its centre is the cell's point moved by half the
    difference of the opposite distances, turned by the angle; its sides are the sums of opposite distances.

    ``nm`` stays 0 (no mask coefficients); ``ne`` counts the rotation channels."""

    task = "obb"
    model_kind = "oriented box"

    def __init__(self, num_classes: int, channels: Sequence[int], strides: Sequence[int],
                 num_angles: int = NUM_ANGLES, reg_max: int = REG_MAX, legacy: bool = True) -> None:
        super().__init__(num_classes, channels, strides, reg_max, legacy)
        self.ne = num_angles
        self.no += num_angles
        hidden = max(channels[0] // 4, num_angles)
        self.cv4 = nn.ModuleList(plain_branch(c, hidden, num_angles) for c in channels)

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Raw maps ``[B, 4*reg_max + nc + 1, H/s, W/s]`` per level: distance logits, class logits, angle logit."""
        return [torch.cat((box(x), cls(x), angle(x)), 1)
                for box, cls, angle, x in zip(self.cv2, self.cv3, self.cv4, features)]

    def decode(self, maps: list[torch.Tensor]) -> torch.Tensor:
        """Raw maps → ``[B, N, 5+nc+1]``: the rotated box's cx, cy, w, h in input pixels, an objectness of 1,
        sigmoid class scores, then the angle in radians (see :func:`angle_from_logits`).

        Rows are the cells of each level in order, row-major, as the reference's. Out of place and free of
        data-dependent control flow: differentiable and traceable for export."""
        dtype = torch.float32 if maps[0].dtype == torch.bfloat16 else maps[0].dtype
        flat = torch.cat([p.flatten(2) for p in maps], 2).to(dtype)  # [B, no, N]
        box, scores, angle_logits = flat.split((4 * self.reg_max, self.nc, self.ne), 1)
        angle = angle_from_logits(angle_logits)
        points, strides = self._anchor_points(maps, dtype)
        left_top, right_bottom = self.dfl(box).chunk(2, 1)  # distances in grid units, along the box's axes
        along_x, along_y = ((right_bottom - left_top) / 2).chunk(2, 1)  # the centre's offset in the box's frame
        cos, sin = angle.cos(), angle.sin()
        offset = torch.cat((along_x * cos - along_y * sin, along_x * sin + along_y * cos), 1)
        centre = (points + offset) * strides
        size = (left_top + right_bottom) * strides
        columns = [centre, size, torch.ones_like(centre[:, :1]), scores.sigmoid(), angle]
        return torch.cat([c.transpose(1, 2) for c in columns], 2)
