"""The anchor-free detection head (YOLOv5u, YOLOv8, YOLO11): per level a box branch predicting a distribution
over ``reg_max`` distances for each side of the box, and a class branch; decoding by the distributions'
expected values (DFL) around each cell's centre."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ..blocks import Conv
from .blocks import DFL

REG_MAX = 16  # distance bins per box side


def plain_branch(c_in: int, hidden: int, outputs: int) -> nn.Sequential:
    """A head branch: two 3x3 Conv, then a 1x1 convolution with bias giving the outputs."""
    return nn.Sequential(Conv(c_in, hidden, 3), Conv(hidden, hidden, 3), nn.Conv2d(hidden, outputs, 1))


def depthwise_branch(c_in: int, hidden: int, outputs: int) -> nn.Sequential:
    """YOLO11's class branch: two (depthwise 3x3 Conv, pointwise Conv) pairs, then the 1x1 output convolution."""
    return nn.Sequential(nn.Sequential(Conv(c_in, c_in, 3, groups=c_in), Conv(c_in, hidden, 1)),
                         nn.Sequential(Conv(hidden, hidden, 3, groups=hidden), Conv(hidden, hidden, 1)),
                         nn.Conv2d(hidden, outputs, 1))


class AnchorFreeDetect(nn.Module):
    """Predicts, at each cell of each level, ``4 * reg_max`` distance logits (left, top, right, bottom) and
    ``nc`` class logits; no objectness.

    ``cv2`` is the box branch, ``cv3`` the class branch: two 3x3 Conv and a 1x1 convolution each, or with
    ``legacy=False`` (YOLO11: the reference builds it so once a YAML uses C3k2) a class branch of depthwise
    3x3 + pointwise Conv pairs. Like :class:`~yolotrain.model.detect.Detect` it declares ``task``,
    ``model_kind``, ``nm`` (mask coefficients per prediction) and ``npr`` (prototype channels); ``stride`` is a
    non-persistent buffer, so the state dict's names are the reference's.
    """

    task = "detect"
    model_kind = "detection"
    nm = 0  # no mask coefficients, hence no prototype masks
    npr = 0  # no prototype module

    def __init__(self, num_classes: int, channels: Sequence[int], strides: Sequence[int],
                 reg_max: int = REG_MAX, legacy: bool = True) -> None:
        super().__init__()
        self.nc = num_classes
        self.nl = len(channels)
        self.reg_max = reg_max
        self.legacy = legacy
        self.no = 4 * reg_max + num_classes + self.nm
        self.register_buffer("stride", torch.tensor(list(strides), dtype=torch.float32), persistent=False)
        box_hidden = max(16, channels[0] // 4, 4 * reg_max)
        cls_hidden = max(channels[0], min(num_classes, 100))
        self.cv2 = nn.ModuleList(plain_branch(c, box_hidden, 4 * reg_max) for c in channels)
        branch = plain_branch if legacy else depthwise_branch
        self.cv3 = nn.ModuleList(branch(c, cls_hidden, num_classes) for c in channels)
        self.dfl: nn.Module = DFL(reg_max) if reg_max > 1 else nn.Identity()
        self._initialise_biases(strides)

    def _initialise_biases(self, strides: Sequence[int]) -> None:
        """The reference's priors: box logits 2.0; class logits for ~5 objects of ``nc`` classes per 640 image."""
        with torch.no_grad():
            for box, cls, stride in zip(self.cv2, self.cv3, strides):
                box[-1].bias.fill_(2.0)
                cls[-1].bias.fill_(math.log(5 / self.nc / (640 / stride) ** 2))

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Raw maps ``[B, 4*reg_max + nc, H/s, W/s]`` per level: distance logits, then class logits."""
        return [torch.cat((box(x), cls(x)), 1) for box, cls, x in zip(self.cv2, self.cv3, features)]

    def decode(self, maps: list[torch.Tensor]) -> torch.Tensor:
        """Raw maps → ``[B, N, 5+nc+nm]``: cx, cy, w, h in input pixels, an objectness of 1 (the YOLOv5 form,
        whose NMS multiplies class scores by it), sigmoid class scores, then the mask coefficients as they are.

        Rows are the cells of each level in order, row-major, as the reference's. Out of place and free of
        data-dependent control flow: differentiable and traceable for export."""
        dtype = torch.float32 if maps[0].dtype == torch.bfloat16 else maps[0].dtype
        flat = torch.cat([p.flatten(2) for p in maps], 2).to(dtype)  # [B, no, N]
        # No empty part for a model without masks: converters such as PNNX refuse a zero-sized slice.
        box, scores, *coefficients = flat.split((4 * self.reg_max, self.nc) + ((self.nm,) if self.nm else ()), 1)
        points, strides = self._anchor_points(maps, dtype)
        left_top, right_bottom = self.dfl(box).chunk(2, 1)  # distances in grid units
        top_left = points - left_top
        bottom_right = points + right_bottom
        centre = (top_left + bottom_right) / 2 * strides
        size = (bottom_right - top_left) * strides
        columns = [centre, size, torch.ones_like(centre[:, :1]), scores.sigmoid(), *coefficients]
        return torch.cat([c.transpose(1, 2) for c in columns], 2)

    def _anchor_points(self, maps: list[torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Cell centres in grid units ``[1, 2, N]`` (x, y) and each cell's stride ``[1, 1, N]``."""
        points, strides = [], []
        for i, p in enumerate(maps):
            ny, nx = p.shape[2:]
            ys = torch.arange(ny, device=p.device, dtype=dtype) + 0.5
            xs = torch.arange(nx, device=p.device, dtype=dtype) + 0.5
            yv, xv = torch.meshgrid(ys, xs, indexing="ij")
            points.append(torch.stack((xv, yv)).view(2, ny * nx))
            strides.append(self.stride[i].to(dtype).expand(ny * nx))
        return torch.cat(points, 1).unsqueeze(0), torch.cat(strides).view(1, 1, -1)
