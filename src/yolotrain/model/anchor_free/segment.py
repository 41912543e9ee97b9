"""The anchor-free segmentation head (YOLOv8-seg, YOLO11-seg): the anchor-free detection head with a third
branch of mask coefficients, and the prototype masks those coefficients combine."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..blocks import Conv
from .head import REG_MAX, AnchorFreeDetect, plain_branch

NUM_MASKS = 32  # mask coefficients per prediction, one per prototype mask
NUM_PROTOS = 256  # hidden channels of the prototype module at width multiple 1 (scaled as the reference scales them)


class AnchorFreeProto(nn.Module):
    """Prototype masks ``[B, nm, 2H, 2W]`` from the stride-8 features ``[B, C, H, W]``.

    YOLOv5's :class:`~yolotrain.model.segment.Proto` with a learned upsampling (a 2x2 transposed convolution,
    as the anchor-free reference has) instead of a nearest-neighbour one."""

    def __init__(self, c_in: int, hidden: int = NUM_PROTOS, num_masks: int = NUM_MASKS) -> None:
        super().__init__()
        self.cv1 = Conv(c_in, hidden, 3)
        self.upsample = nn.ConvTranspose2d(hidden, hidden, 2, 2, 0, bias=True)
        self.cv2 = Conv(hidden, hidden, 3)
        self.cv3 = Conv(hidden, num_masks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(self.cv2(self.upsample(self.cv1(x))))


class AnchorFreeSegment(AnchorFreeDetect):
    """:class:`AnchorFreeDetect` whose cells also predict ``nm`` mask coefficients (``cv4``, after the class
    logits in every map), and the :class:`AnchorFreeProto` module they combine (``npr`` hidden channels)."""

    task = "segment"
    model_kind = "segmentation"

    def __init__(self, num_classes: int, channels: Sequence[int], strides: Sequence[int],
                 num_masks: int = NUM_MASKS, num_protos: int = NUM_PROTOS, reg_max: int = REG_MAX,
                 legacy: bool = True) -> None:
        super().__init__(num_classes, channels, strides, reg_max, legacy)
        self.nm = num_masks
        self.npr = num_protos
        self.no += num_masks
        self.proto = AnchorFreeProto(channels[0], num_protos, num_masks)
        hidden = max(channels[0] // 4, num_masks)
        self.cv4 = nn.ModuleList(plain_branch(c, hidden, num_masks) for c in channels)

    def forward(self, features: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Raw maps ``[B, 4*reg_max + nc + nm, H/s, W/s]`` per level and the prototypes ``[B, nm, H/4, W/4]``."""
        maps = [torch.cat((box(x), cls(x), mask(x)), 1)
                for box, cls, mask, x in zip(self.cv2, self.cv3, self.cv4, features)]
        return maps, self.proto(features[0])
