"""Sliced inference (SAHI's idea, on the letterboxed input): small objects in large images are found by
running the model on overlapping tiles of the image at full resolution instead of on the whole image
shrunk to the network's size.

:class:`SlicedDetector` wraps a detector: it cuts each ``[B, 3, H, W]`` batch into tiles of ``slice`` px
(the last one of each row and column flush with the image's border, the tiles spread evenly so two
neighbours overlap by at least ``slice_overlap`` of a tile), runs the wrapped detector on the tiles,
moves each tile's decoded boxes to the image's pixels and returns them all, so the usual one NMS
merges the detections of overlapping tiles. Only the tiles are predicted on (not the whole image as
well): an object larger than the overlap may be cut in two by the tiles, so slicing is for small
objects, with ``--img`` set to the images' own resolution (slicing a 640 px input into 640 px tiles
changes nothing).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from ..model import Yolov5
from ..settings import ConfigError, setting
from .tta import AugmentedDetector, EnsembleDetector, _Composite

# How many tiles go through the wrapped detector at once (at least a batch's images).
TILE_BATCH = 8


@dataclass(frozen=True)
class SliceConfig:
    """The sliced inference settings of ``val`` and ``predict``."""

    slice: int | None = setting(None, "sliced inference: predict on overlapping tiles of this many px of the input "
                                "(with --img at the images' resolution) and merge them by NMS, for small objects "
                                "in large images (PyTorch detection models; default: off)", min=0)
    slice_overlap: float = setting(0.2, "with --slice: the least overlap of neighbouring tiles, as a fraction of a "
                                   "tile (0 to below 1)", min=0)

    def __post_init__(self) -> None:
        if (refusal := slice_settings_refusal(self.slice, self.slice_overlap)) is not None:
            raise ConfigError(refusal)


def slice_settings_refusal(tile: int | None, overlap: float) -> str | None:
    """Why the settings ``slice=tile, slice_overlap=overlap`` cannot slice, in one line; None when they can."""
    if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 0):
        return f"--slice must be a tile side in px (0: off), got {tile!r}"
    if not 0 <= overlap < 1:
        return f"--slice-overlap must be at least 0 and below 1 (a fraction of a tile), got {overlap!r}"
    return None


def tile_origins(length: int, tile: int, overlap: float) -> list[int]:
    """Where the tiles of side ``tile`` start along a side of ``length`` px: the first at 0, the last flush
    with the end, and between them the fewest tiles that keep each two neighbours overlapping by at least
    ``overlap`` of a tile, spread evenly. A side no longer than a tile has one tile (of the side's length)."""
    if length <= tile:
        return [0]
    step = max(1, math.floor(tile * (1 - overlap)))
    gaps = math.ceil((length - tile) / step)
    return [round(i * (length - tile) / gaps) for i in range(gaps + 1)]


def tile_boxes(height: int, width: int, tile: int, overlap: float) -> list[tuple[int, int, int, int]]:
    """The tiles covering a ``height`` x ``width`` image as ``(top, left, tile height, tile width)``, row by row
    (a side shorter than ``tile`` is covered whole by each of its tiles)."""
    tile_h, tile_w = min(tile, height), min(tile, width)
    return [(top, left, tile_h, tile_w) for top in tile_origins(height, tile, overlap)
            for left in tile_origins(width, tile, overlap)]


def rounded_tile(tile: int, multiple: int) -> int:
    """``tile`` rounded up to a multiple of the model's input ``multiple`` (its largest stride), with a
    warning saying so when it was not one."""
    rounded = math.ceil(tile / multiple) * multiple
    if rounded != tile:
        warnings.warn(f"--slice {tile} is not a multiple of the model's stride {multiple}: tiles of {rounded} px",
                      stacklevel=3)
    return rounded


class SlicedDetector(_Composite):
    """A PyTorch detection model (or its test-time augmentation, or an ensemble) run on overlapping tiles:
    its ``[B, N', 5+nc]`` predictions gather those of every tile of each image, in the image's pixels."""

    def __init__(self, model: Yolov5 | AugmentedDetector | EnsembleDetector, tile: int,
                 overlap: float = SliceConfig.slice_overlap) -> None:
        super().__init__()
        if (refusal := slice_settings_refusal(tile, overlap)) is not None or not tile:
            raise ValueError(refusal or "SlicedDetector needs a tile side above 0")
        self.model = model
        self.tile = rounded_tile(tile, max(self.lead.size_multiple, 32))
        self.overlap = overlap

    @property
    def lead(self) -> Yolov5:  # type: ignore[override]
        return self.model.lead if isinstance(self.model, _Composite) else self.model

    @property
    def first(self) -> Yolov5:  # type: ignore[override]
        return self.model.first if isinstance(self.model, _Composite) else self.model

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        b, _, h, w = imgs.shape
        tiles = tile_boxes(h, w, self.tile, self.overlap)
        crops = torch.cat([imgs[:, :, top:top + th, left:left + tw] for top, left, th, tw in tiles])
        chunk = max(b, TILE_BATCH)
        pred = torch.cat([self.model(crops[i:i + chunk]) for i in range(0, len(crops), chunk)])
        # float32 before the move: fp16 has 2 px steps beyond 2048 px.
        pred = pred.float().view(len(tiles), b, *pred.shape[1:])  # tile-major, as the crops were stacked
        origins = torch.tensor([(left, top) for top, left, _, _ in tiles], dtype=pred.dtype, device=pred.device)
        xy = pred[..., :2] + origins[:, None, None, :]
        moved = torch.cat((xy, pred[..., 2:]), -1)
        return moved.transpose(0, 1).reshape(b, -1, pred.shape[-1])
