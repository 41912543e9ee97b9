"""The YOLOv5 segmentation head: the Detect head with 32 mask coefficients per anchor, and Proto, the
mask prototypes computed from the finest pyramid level at twice its resolution (stride 4)."""

from __future__ import annotations

import torch
from torch import nn

from .blocks import Conv
from .detect import STRIDES, Detect

NUM_MASKS = 32  # mask coefficients per anchor, one per prototype mask
NUM_PROTOS = 256  # hidden channels of Proto at width multiple 1 (scaled as the reference scales them)


class Proto(nn.Module):
    """Prototype masks ``[B, nm, 2H, 2W]`` from the stride-8 features ``[B, C, H, W]``."""

    def __init__(self, c_in: int, hidden: int = NUM_PROTOS, num_masks: int = NUM_MASKS) -> None:
        super().__init__()
        self.cv1 = Conv(c_in, hidden, 3)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.cv2 = Conv(hidden, hidden, 3)
        self.cv3 = Conv(hidden, num_masks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(self.cv2(self.upsample(self.cv1(x))))


class Segment(Detect):
    """Detect head whose anchors also predict ``nm`` mask coefficients (after the class logits), and the
    :class:`Proto` module those coefficients combine (``nm`` and ``npr`` as the reference names them).
    :meth:`Detect.decode` passes the coefficients through raw."""

    task = "segment"
    model_kind = "segmentation"

    def __init__(self, num_classes: int, anchors: torch.Tensor, channels: tuple[int, ...],
                 strides: tuple[int, ...] = STRIDES, num_masks: int = NUM_MASKS, num_protos: int = NUM_PROTOS) -> None:
        super().__init__(num_classes, anchors, channels, strides, extra_outputs=num_masks)
        self.nm = num_masks
        self.npr = num_protos
        self.proto = Proto(channels[0], num_protos, num_masks)

    def forward(self, features: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Raw maps ``[B, na, H/s, W/s, 5+nc+nm]`` per level and the prototypes ``[B, nm, H/4, W/4]``."""
        return super().forward(features), self.proto(features[0])
