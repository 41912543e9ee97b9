"""The YOLOv5 (v6/v7) detector: CSP-Darknet backbone with SPPF, PAN neck, three-level Detect head."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch
from torch import nn

from .blocks import C3, SPPF, Concat, Conv
from .detect import DEFAULT_ANCHORS, STRIDES, Detect

# (depth multiple, width multiple) of each published size.
VERSIONS: dict[str, tuple[float, float]] = {
    "n": (0.33, 0.25),
    "s": (0.33, 0.50),
    "m": (0.67, 0.75),
    "l": (1.00, 1.00),
    "x": (1.33, 1.25),
}


def parse_version(version: str) -> str:
    """Accept 'n' or 'yolov5n' (any case); raise a ValueError naming the choices otherwise."""
    key = str(version).lower().removeprefix("yolov5")
    if key not in VERSIONS:
        choices = ", ".join(repr(v) for v in VERSIONS)
        raise ValueError(f"unknown YOLOv5 version {version!r}: choose one of {choices} (or 'yolov5n' ...)")
    return key


def _anchor_tensor(anchors: Sequence[Sequence[float]] | torch.Tensor | None) -> torch.Tensor:
    """Anchors in pixels as a ``[3 levels, na, 2]`` tensor; rows of flat (w, h) pairs are accepted."""
    table = torch.as_tensor(DEFAULT_ANCHORS if anchors is None else anchors, dtype=torch.float32)
    if table.ndim == 2 and table.shape[1] % 2 == 0:
        table = table.view(table.shape[0], -1, 2)
    if table.ndim != 3 or table.shape[0] != len(STRIDES) or table.shape[2] != 2:
        raise ValueError(f"anchors must give (w, h) pairs for {len(STRIDES)} levels, got shape {tuple(table.shape)}")
    return table


class Yolov5(nn.Module):
    """YOLOv5 detector.

    In ``train()`` mode ``model(imgs)`` returns the three raw head maps ``[B, 3, H/s, W/s, 5+nc]``
    (s = 8, 16, 32); in ``eval()`` mode it returns decoded boxes ``[B, N, 5+nc]``. Input sides must be
    multiples of 32. ``self.model`` keeps the reference's layer indices, so a reference
    ``state_dict`` loads unchanged.
    """

    def __init__(self, version: str = "s", num_classes: int = 80,
                 anchors: Sequence[Sequence[float]] | torch.Tensor | None = None, in_channels: int = 3,
                 names: Sequence[str] | None = None) -> None:
        super().__init__()
        if int(num_classes) < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.version = parse_version(version)
        self.num_classes = int(num_classes)
        self.names = [str(n) for n in names] if names is not None else [str(i) for i in range(self.num_classes)]
        if len(self.names) != self.num_classes:
            raise ValueError(f"{len(self.names)} class names for {self.num_classes} classes")
        self.in_channels = int(in_channels)
        depth_multiple, width_multiple = VERSIONS[self.version]

        def width(channels: int) -> int:
            return math.ceil(channels * width_multiple / 8) * 8

        def depth(repeats: int) -> int:
            return max(round(repeats * depth_multiple), 1)

        self.model = nn.ModuleList([
            # backbone
            Conv(in_channels, width(64), 6, 2, 2),          # 0  P1/2
            Conv(width(64), width(128), 3, 2),              # 1  P2/4
            C3(width(128), width(128), depth(3)),           # 2
            Conv(width(128), width(256), 3, 2),             # 3  P3/8
            C3(width(256), width(256), depth(6)),           # 4
            Conv(width(256), width(512), 3, 2),             # 5  P4/16
            C3(width(512), width(512), depth(9)),           # 6
            Conv(width(512), width(1024), 3, 2),            # 7  P5/32
            C3(width(1024), width(1024), depth(3)),         # 8
            SPPF(width(1024), width(1024), 5),              # 9
            # neck: top-down (FPN) then bottom-up (PAN)
            Conv(width(1024), width(512), 1, 1),            # 10
            nn.Upsample(scale_factor=2, mode="nearest"),    # 11
            Concat(),                                       # 12 with backbone P4 (6)
            C3(width(1024), width(512), depth(3), False),   # 13
            Conv(width(512), width(256), 1, 1),             # 14
            nn.Upsample(scale_factor=2, mode="nearest"),    # 15
            Concat(),                                       # 16 with backbone P3 (4)
            C3(width(512), width(256), depth(3), False),    # 17 → P3/8 output
            Conv(width(256), width(256), 3, 2),             # 18
            Concat(),                                       # 19 with neck (14)
            C3(width(512), width(512), depth(3), False),    # 20 → P4/16 output
            Conv(width(512), width(512), 3, 2),             # 21
            Concat(),                                       # 22 with neck (10)
            C3(width(1024), width(1024), depth(3), False),  # 23 → P5/32 output
            Detect(self.num_classes, _anchor_tensor(anchors), (width(256), width(512), width(1024))),  # 24
        ])

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> Yolov5:
        """Load our checkpoint, a plain ``state_dict`` file, or an official YOLOv5 ``.pt`` (read safely,
        without running pickled code); the architecture and class names come from the file."""
        from ..interop import load_model

        return load_model(path)

    @property
    def head(self) -> Detect:
        return self.model[-1]

    @property
    def stride(self) -> torch.Tensor:
        return self.head.stride

    def forward_maps(self, imgs: torch.Tensor) -> list[torch.Tensor]:
        """Raw head maps whatever the mode (validation loss needs them in eval mode too)."""
        self._check_input(imgs)
        m = self.model
        x = m[3](m[2](m[1](m[0](imgs))))
        p3 = m[4](x)
        p4 = m[6](m[5](p3))
        x = m[9](m[8](m[7](p4)))
        lateral5 = m[10](x)
        x = m[13](m[12]([m[11](lateral5), p4]))
        lateral4 = m[14](x)
        out3 = m[17](m[16]([m[15](lateral4), p3]))
        out4 = m[20](m[19]([m[18](out3), lateral4]))
        out5 = m[23](m[22]([m[21](out4), lateral5]))
        return self.head([out3, out4, out5])

    def forward(self, imgs: torch.Tensor) -> list[torch.Tensor] | torch.Tensor:
        maps = self.forward_maps(imgs)
        return maps if self.training else self.head.decode(maps)

    def _check_input(self, imgs: torch.Tensor) -> None:
        if imgs.ndim != 4 or imgs.shape[1] != self.in_channels:
            raise ValueError(f"expected images [B, {self.in_channels}, H, W], got shape {tuple(imgs.shape)}")
        h, w = imgs.shape[2:]
        if h % 32 or w % 32:
            raise ValueError(f"image sides must be multiples of 32, got {h}x{w} (letterbox or resize first)")

    def fuse(self) -> Yolov5:
        """Fold every BatchNorm into its convolution (inference only); returns self in eval mode."""
        self.eval()
        for module in self.modules():
            if isinstance(module, Conv):
                module.fuse()
        return self

    def extra_repr(self) -> str:
        return f"version={self.version!r}, num_classes={self.num_classes}"
