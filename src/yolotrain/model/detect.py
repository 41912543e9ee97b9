"""The YOLOv5 detection head: one 1x1 convolution per pyramid level, anchors, decoding."""

from __future__ import annotations

import math

import torch
from torch import nn

# The reference default anchors (pixels), one row of three (w, h) pairs per level P3/8, P4/16, P5/32.
DEFAULT_ANCHORS: tuple[tuple[int, ...], ...] = (
    (10, 13, 16, 30, 33, 23),
    (30, 61, 62, 45, 59, 119),
    (116, 90, 156, 198, 373, 326),
)
STRIDES: tuple[int, int, int] = (8, 16, 32)


class Detect(nn.Module):
    """Predicts, for each anchor of each cell, box offsets (4), objectness (1) and class logits (nc).

    ``anchors`` is stored in grid units (pixels / stride) under the reference's buffer name, so
    reference checkpoints load unchanged. ``extra_outputs`` more per anchor follow the class logits
    (the mask coefficients of :class:`~yolotrain.model.segment.Segment`), with zero bias priors.

    A head declares what its outputs serve, so that a model is what its head makes it: ``task`` (the task
    whose predictions it makes), ``model_kind`` (what messages call such a model) and ``nm`` (mask
    coefficients per anchor; a head with some also outputs prototype masks, its ``proto`` module's).
    """

    task = "detect"
    model_kind = "detection"
    nm = 0  # no mask coefficients, hence no prototype masks
    npr = 0  # no prototype module

    def __init__(self, num_classes: int, anchors: torch.Tensor, channels: tuple[int, ...],
                 strides: tuple[int, ...] = STRIDES, extra_outputs: int = 0) -> None:
        super().__init__()
        self.nc = num_classes
        self.no = num_classes + 5 + extra_outputs
        self.nl = anchors.shape[0]
        self.na = anchors.shape[1]
        stride = torch.tensor(strides, dtype=torch.float32)
        self.register_buffer("stride", stride, persistent=False)
        self.register_buffer("anchors", anchors.float() / stride.view(-1, 1, 1))
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in channels)
        self._initialise_biases()

    def _initialise_biases(self) -> None:
        """Prior biases (RetinaNet §3.3): ~8 objects per 640 image, uniform class prior of 0.6."""
        with torch.no_grad():
            for conv, stride in zip(self.m, self.stride.tolist()):
                bias = conv.bias.view(self.na, self.no)
                obj_prior = math.log(8 / (640 / stride) ** 2)
                cls_prior = math.log(0.6 / (self.nc - 0.99999))
                prior = torch.cat((torch.zeros(4), torch.tensor([obj_prior]), torch.full((self.nc,), cls_prior),
                                   torch.zeros(self.no - 5 - self.nc)))
                conv.bias.copy_((bias + prior).view(-1))

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Raw head maps ``[B, na, H/s, W/s, 5+nc]`` (logits) for each level."""
        return [view.contiguous() for view in self.map_views(features)]

    def map_views(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """:meth:`forward`'s maps as views of the convolutions' outputs (not contiguous when those are
        channels-last): what :meth:`decode_into_one` reads without a copy."""
        views = []
        for conv, x in zip(self.m, features):
            y = conv(x)
            b, _, ny, nx = y.shape
            views.append(y.view(b, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2))
        return views

    def decode(self, maps: list[torch.Tensor]) -> torch.Tensor:
        """Raw maps → ``[B, N, 5+nc+extra]``: cx, cy, w, h in input pixels, sigmoid objectness and class
        scores, then the extra outputs as they are (a segmentation head's mask coefficients: they weight the
        prototypes, a sigmoid follows their sum), each level's rows written once."""
        decoded = []
        num_extra = self.no - self.nc - 5
        for i, p in enumerate(maps):
            if p.dtype == torch.bfloat16:
                # bf16 keeps 8 significant bits: pixel coordinates would be off by up to 2 px at 640.
                p = p.float()
            b, na, ny, nx, no = p.shape
            grid, anchor_grid = self._grid(nx, ny, i, p.dtype, p.device)
            extra = []
            if num_extra:
                p, coefficients = p.split((self.nc + 5, num_extra), 4)
                extra = [coefficients]
            xy, wh, conf = p.sigmoid().split((2, 2, self.nc + 1), 4)
            xy = (xy * 2 + grid) * self.stride[i]
            wh = wh * 2
            wh = wh * wh * anchor_grid  # a product, not pow(): LiteRT has no float pow kernel
            decoded.append(torch.cat((xy, wh, conf, *extra), 4).view(b, na * ny * nx, no))
        return torch.cat(decoded, 1)

    def decode_into_one(self, maps: list[torch.Tensor]) -> torch.Tensor:
        """:meth:`decode`'s output for the maps :meth:`forward` gives, bit for bit, from those maps or their
        :meth:`map_views`, each level written into its rows of one output tensor: no per-level pieces and
        concatenations, so the largest transient is the output itself (a 32-image segmentation batch's is
        60 MB at 256 px). In-place writes into views: what graphs (exports) trace is :meth:`decode`."""
        dtype = torch.float32 if maps[0].dtype == torch.bfloat16 else maps[0].dtype
        counts = [p.shape[1] * p.shape[2] * p.shape[3] for p in maps]
        out = torch.empty((maps[0].shape[0], sum(counts), self.no), dtype=dtype, device=maps[0].device)
        scored = self.nc + 5
        for i, (p, rows) in enumerate(zip(maps, out.split(counts, 1))):
            p = p.float() if p.dtype == torch.bfloat16 else p
            b, na, ny, nx, no = p.shape
            grid, anchor_grid = self._grid(nx, ny, i, p.dtype, p.device)
            y = rows.view(b, na, ny, nx, no)
            # The sigmoid runs over the same runs of values as decode's: its vectorised and scalar paths may
            # differ in the last bit.
            if scored < no:
                torch.sigmoid(p[..., :scored], out=y[..., :scored])
                y[..., scored:] = p[..., scored:]
            else:
                y.copy_(p.contiguous().sigmoid())
            y[..., :2].mul_(2).add_(grid).mul_(self.stride[i])
            wh = y[..., 2:4].mul_(2)
            wh.mul_(wh).mul_(anchor_grid)
        return out

    def _grid(self, nx: int, ny: int, level: int, dtype: torch.dtype,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Cell offsets (shifted by -0.5: centres range over -0.5..1.5 of a cell) and anchor sizes in pixels."""
        ys = torch.arange(ny, device=device, dtype=dtype)
        xs = torch.arange(nx, device=device, dtype=dtype)
        yv, xv = torch.meshgrid(ys, xs, indexing="ij")
        grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2) - 0.5
        anchor_grid = (self.anchors[level] * self.stride[level]).to(dtype).view(1, self.na, 1, 1, 2)
        return grid, anchor_grid
