"""Sliced inference (SAHI's idea, on the letterboxed input): small objects in large images are found by
running the model on overlapping tiles of the image at full resolution instead of on the whole image
shrunk to the network's size.

:class:`SlicedDetector` wraps a detector: it cuts each ``[B, 3, H, W]`` batch into tiles of ``slice`` px
(the last one of each row and column flush with the image's border, the tiles spread evenly so two
neighbours overlap by at least ``slice_overlap`` of a tile), runs the wrapped detector on the tiles and
hands their outputs to the model's task (:meth:`yolotrain.task.Task.join_tile_outputs`), which makes of them
the outputs the model gives for whole images: each tile's decoded boxes moved to the image's pixels and
gathered per image (:meth:`TiledBatch.predictions`), so the usual one NMS merges the detections of
overlapping tiles, and any image-aligned maps beside them (a segmentation model's prototype masks) stitched
into one map of the image (:meth:`TiledBatch.maps`). Only the tiles are predicted on (not the whole image as
well): an object larger than the overlap may be cut in two by the tiles, so slicing is for small objects,
with ``--img`` set to the images' own resolution (slicing a 640 px input into 640 px tiles changes nothing).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..model import Yolov5
from ..settings import ConfigError, setting
from ..task import Task, task_of
from .tta import AugmentedDetector, EnsembleDetector, _Composite

# How many tiles go through the wrapped detector at once (at least a batch's images).
TILE_BATCH = 8

# A tile as (top, left, height, width) in the input's pixels.
Tile = tuple[int, int, int, int]


@dataclass(frozen=True)
class SliceConfig:
    """The sliced inference settings of ``val`` and ``predict``."""

    slice: int | None = setting(None, "sliced inference: predict on overlapping tiles of this many px of the input "
                                "(with --img at the images' resolution) and merge them by NMS, for small objects "
                                "in large images (PyTorch detection and segmentation models; default: off)", min=0)
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


def tile_origins(length: int, tile: int, overlap: float, grid: int = 1) -> list[int]:
    """Where the tiles of side ``tile`` start along a side of ``length`` px: the first at 0, the last flush
    with the end, and between them the fewest tiles on multiples of ``grid`` px that keep each two neighbours
    overlapping by at least ``overlap`` of a tile, spread as evenly as the grid allows. With ``length - tile``
    a multiple of ``grid`` every tile starts on the grid (where the overlap would need neighbours closer than
    one grid step, they are one step apart). A side no longer than a tile has one tile (of the side's length)."""
    if length <= tile:
        return [0]
    # A step that is a whole number of grid steps: rounding evenly spread origins to the grid then keeps
    # every gap within it (the gaps are the floor or the ceiling of the even spacing, in grid steps).
    step = max(grid, math.floor(tile * (1 - overlap) / grid) * grid)
    gaps = math.ceil((length - tile) / step)
    return [round(i * (length - tile) / gaps / grid) * grid for i in range(gaps)] + [length - tile]


def tile_boxes(height: int, width: int, tile: int, overlap: float, grid: int = 1) -> list[Tile]:
    """The tiles covering a ``height`` x ``width`` image as ``(top, left, tile height, tile width)``, row by row
    (a side shorter than ``tile`` is covered whole by each of its tiles), starting on multiples of ``grid``
    (see :func:`tile_origins`)."""
    tile_h, tile_w = min(tile, height), min(tile, width)
    return [(top, left, tile_h, tile_w) for top in tile_origins(height, tile, overlap, grid)
            for left in tile_origins(width, tile, overlap, grid)]


def rounded_tile(tile: int, multiple: int) -> int:
    """``tile`` rounded up to a multiple of the model's input ``multiple`` (its largest stride), with a
    warning saying so when it was not one."""
    rounded = math.ceil(tile / multiple) * multiple
    if rounded != tile:
        warnings.warn(f"--slice {tile} is not a multiple of the model's stride {multiple}: tiles of {rounded} px",
                      stacklevel=3)
    return rounded


@dataclass(frozen=True)
class TiledBatch:
    """How a batch of ``batch`` images of ``image_hw`` px was cut: its ``tiles`` (row by row, as
    :func:`tile_boxes` gives them), the crops stacked tile-major (every image's first tile, then every image's
    second ...). What a task joins its model's outputs on the crops with, back into outputs of whole images."""

    tiles: Sequence[Tile]
    batch: int
    image_hw: tuple[int, int]

    def predictions(self, chunks: Sequence[torch.Tensor]) -> torch.Tensor:
        """Decoded predictions ``[B, N', C]`` of the images (xywh in the image's pixels first, float32) from
        those of the crops, ``chunks`` of ``[n, N, C]`` in the crops' order: each tile's boxes moved by its
        origin, every tile's predictions of an image gathered (tile after tile) for the one NMS."""
        pred = torch.cat(list(chunks))
        # float32 before the move: fp16 has 2 px steps beyond 2048 px.
        pred = pred.float().view(len(self.tiles), self.batch, *pred.shape[1:])  # tile-major, as the crops
        origins = torch.tensor([(left, top) for top, left, _, _ in self.tiles], dtype=pred.dtype, device=pred.device)
        moved = torch.cat((pred[..., :2] + origins[:, None, None, :], pred[..., 2:]), -1)
        return moved.transpose(0, 1).reshape(self.batch, -1, pred.shape[-1])

    def maps(self, chunks: Sequence[torch.Tensor]) -> torch.Tensor:
        """One map ``[B, C, H/s, W/s]`` per image, stitched from the tiles' maps ``[n, C, h/s, w/s]`` (``chunks``
        in the crops' order; ``s``: the maps' stride, the tiles' side over the maps').

        Each pixel of the image's map is taken from the tile whose centre is nearest (along each axis; the
        seams halve the overlaps): every tile's map is worst near its own border, where the convolutions saw
        padding instead of the image, and best where the tile's content surrounds the pixel most. The tiles
        form a grid, so the owners are bands of rows times bands of columns: one crop of each tile's map, joined
        without copying any pixel twice.

        Raises:
            ValueError: a tile does not start on a whole pixel of the maps (tiles cut off the maps' grid).
        """
        maps = torch.cat(list(chunks))
        tile_h, tile_w = self.tiles[0][2:]
        stride = max(tile_h // maps.shape[-2], 1)
        if stride * maps.shape[-2] != tile_h or stride * maps.shape[-1] != tile_w or any(
                top % stride or left % stride for top, left, _, _ in self.tiles):
            raise ValueError(f"tiles of {tile_h}x{tile_w} px at {[t[:2] for t in self.tiles]} do not lie on the "
                             f"grid of their {maps.shape[-2]}x{maps.shape[-1]} maps")
        maps = maps.view(len(self.tiles), self.batch, *maps.shape[1:])
        tops = sorted({top // stride for top, _, _, _ in self.tiles})
        lefts = sorted({left // stride for _, left, _, _ in self.tiles})
        rows = _owned_bands(tops, tile_h // stride, self.image_hw[0] // stride)
        cols = _owned_bands(lefts, tile_w // stride, self.image_hw[1] // stride)
        return torch.cat([torch.cat([maps[r * len(lefts) + c, ..., y0 - top:y1 - top, x0 - left:x1 - left]
                                     for c, (left, (x0, x1)) in enumerate(zip(lefts, cols))], -1)
                          for r, (top, (y0, y1)) in enumerate(zip(tops, rows))], -2)


def _owned_bands(origins: list[int], tile: int, length: int) -> list[tuple[int, int]]:
    """Per tile along one axis (``origins`` sorted, ``tile`` long, covering ``length``), the span ``[start,
    end)`` nearer its centre than any other tile's: the seam between two neighbours halves their overlap."""
    seams = [(a + b + tile) // 2 for a, b in zip(origins, origins[1:])]
    return list(zip([0, *seams], [*seams, length]))


class SlicedDetector(_Composite):
    """A PyTorch box model (detection or segmentation; or a detector's test-time augmentation, or an ensemble)
    run on overlapping tiles: its outputs are those the wrapped model gives for whole images, joined by the
    model's task from the tiles' (:meth:`yolotrain.task.Task.join_tile_outputs`): the ``[B, N', 5+nc(+nm)]``
    predictions gather those of every tile of each image, in the image's pixels (a segmentation model's
    prototype masks come stitched from the tiles' into one ``[B, nm, H/4, W/4]`` map per image)."""

    def __init__(self, model: Yolov5 | AugmentedDetector | EnsembleDetector, tile: int,
                 overlap: float = SliceConfig.slice_overlap) -> None:
        super().__init__()
        if (refusal := slice_settings_refusal(tile, overlap)) is not None or not tile:
            raise ValueError(refusal or "SlicedDetector needs a tile side above 0")
        self.model = model
        self.tile = rounded_tile(tile, max(self.lead.size_multiple, 32))
        self.overlap = overlap
        self.joiner: Task = task_of(self.lead)
        self.grid = self.joiner.tile_grid(self.lead)

    @property
    def lead(self) -> Yolov5:  # type: ignore[override]
        return self.model.lead if isinstance(self.model, _Composite) else self.model

    @property
    def first(self) -> Yolov5:  # type: ignore[override]
        return self.model.first if isinstance(self.model, _Composite) else self.model

    def forward(self, imgs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        b, _, h, w = imgs.shape
        tiles = tile_boxes(h, w, self.tile, self.overlap, self.grid)
        crops = torch.cat([imgs[:, :, top:top + th, left:left + tw] for top, left, th, tw in tiles])
        chunk = max(b, TILE_BATCH)
        outputs = [self.model(crops[i:i + chunk]) for i in range(0, len(crops), chunk)]
        return self.joiner.join_tile_outputs(outputs, TiledBatch(tiles, b, (h, w)))
