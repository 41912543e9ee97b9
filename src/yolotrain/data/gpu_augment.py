"""Training augmentations as batched tensor operations on a device (``--augment-device cuda|cpu``).

The loader processes only read each image's encoded bytes and its labels and draw the sample's random
numbers, in the order and from the distributions of :class:`~yolotrain.data.dataset.DetectionDataset`
(mosaic or not, the 3 extra images, the mosaic centre, the warp, mixup, HSV gains, flips). The batch
is then built where the model runs:

1. decoded (JPEGs on CUDA by nvJPEG, batched; other files and CPU runs by torchvision on the CPU) and
   resized to the size the loader would load each image at;
2. every tile laid into one slot of an atlas per output image, and each output pixel sampled from the
   atlas once, through the inverse of (mosaic placement, then the random perspective): one
   ``grid_sample`` for the whole batch, no intermediate mosaic canvas;
3. mixup partners blended, HSV gains applied with the loader's 8-bit LUT arithmetic, flips;
4. boxes moved by the same matrices, clipped and filtered by the candidate rule, all boxes at once.

Segmentation polygons, rectangular batches and the image caches are not supported on this path.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, encode_jpeg

from ..boxes import letterbox_geometry
from ..settings import ConfigError
from .augment import PAD_VALUE, AugmentConfig
from .batch import Batch
from .dataset import DetectionDataset, ImageReadError, SampleKey, loaded_size

AUGMENT_DEVICES = ("loader", "cpu", "cuda")
_JPEG_MAGIC = b"\xff\xd8\xff"
_EXIF_ORIENTATION = 0x0112
# Each atlas slot has a one-pixel frame of padding, so bilinear sampling at a tile's edge never reaches
# the neighbouring tile.
_FRAME = 1
# The reference's candidate rule (see augment.box_candidates): width and height over 2 px, over 10% of
# the area kept, aspect ratio under 100.
_MIN_SIDE, _MIN_AREA_KEPT, _MAX_ASPECT = 2.0, 0.1, 100.0
# OpenCV's 8-bit RGB to HSV divides by lookup: (180 / 6) / spread and 255 / value, in 12-bit fixed point.
_HSV_SHIFT = 12
_HUE_DIVISORS = torch.tensor([0] + [round((180 << _HSV_SHIFT) / (6 * i)) for i in range(1, 256)], dtype=torch.int32)
_SATURATION_DIVISORS = torch.tensor([0] + [round((255 << _HSV_SHIFT) / i) for i in range(1, 256)], dtype=torch.int32)
# Its HSV to RGB: which of (v, v(1-s), v(1-sf), v(1-s(1-f))) each of R, G, B is, per sixth of the hue circle.
_SECTOR_CHANNELS = torch.tensor([[0, 3, 1], [2, 0, 1], [1, 0, 3], [1, 2, 0], [3, 1, 0], [0, 1, 2]])


def augment_device(name: str, *, rect: bool = False, cache: str = "off", boxes_only: bool = True) -> torch.device:
    """The device that ``--augment-device name`` (``cpu`` or ``cuda``) augments on, or a one-line
    :class:`ConfigError` for a request this path cannot serve."""
    if name not in AUGMENT_DEVICES[1:]:
        raise ConfigError(f"augment_device must be one of {', '.join(AUGMENT_DEVICES)}, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--augment-device cuda needs a CUDA GPU and torch finds none; use --augment-device loader")
    if not boxes_only:
        raise ConfigError("--augment-device augments boxes only; training on masks, keypoints or rotated boxes needs "
                          "--augment-device loader")
    if rect:
        raise ConfigError("--augment-device builds square mosaic batches; --rect needs --augment-device loader")
    if cache != "off":
        raise ConfigError(f"--augment-device decodes on the device from file bytes; --cache {cache} keeps images "
                          "decoded by the loader: leave it off")
    return torch.device(name)


@dataclass
class EncodedBatch:
    """What the loader processes send: encoded images, labels and the random draws of every sample.

    A *tile* is one image placed on a canvas (4 per mosaic, 1 per letterboxed sample); a *composite* is
    one warped canvas (one per sample, two for a sample with mixup); a *sample* is one output image.
    """

    data: list[torch.Tensor]  # encoded bytes of each tile, uint8 1-D
    tile_size: torch.Tensor  # [M, 2] (w, h) the tile is resized to
    tile_anchor: torch.Tensor  # [M, 2] its top-left corner is anchor - size * lead
    tile_lead: torch.Tensor  # [M, 2] 1 where the tile lies left of / above its anchor
    tile_slot: torch.Tensor  # [M] its slot (0..3) in the composite's atlas
    tile_composite: torch.Tensor  # [M]
    tile_orientation: torch.Tensor  # [M] EXIF orientation of JPEGs (1: as stored), for decoders that ignore it
    labels: torch.Tensor  # [L, 5] class + normalised cx, cy, w, h
    label_tile: torch.Tensor  # [L]
    canvas: torch.Tensor  # [K] canvas side before the warp
    warp: torch.Tensor  # [K, 8] perspective x, y, angle, scale, shear x, y, translate x, y (fractions)
    composite_sample: torch.Tensor  # [K] the output image each composite is blended into
    composite_weight: torch.Tensor  # [K] its weight there (mixup's ratio; 1 alone)
    hsv_gain: torch.Tensor  # [B, 3] hue, saturation, value gains
    flip: torch.Tensor  # [B, 2] up-down, left-right


@dataclass
class Composite:
    """One canvas of a sample, as drawn: its tiles (dataset indices) and where they go, and its warp."""

    tiles: list[int]
    size: list[np.ndarray]  # (w, h) of each tile
    anchor: list[tuple[float, float]]
    lead: list[tuple[int, int]]
    canvas: int
    warp: np.ndarray
    weight: float = 1.0


@dataclass
class EncodedSample:
    """One sample from a loader process: its composites, HSV gains, flips, and each tile's bytes and labels."""

    composites: list[Composite]
    hsv: np.ndarray
    flip: tuple[bool, bool]
    data: list[torch.Tensor]
    orientation: list[int]
    labels: list[np.ndarray]


class EncodedDetectionDataset(DetectionDataset):
    """:class:`DetectionDataset`'s training samples as encoded bytes and random draws (an
    :class:`EncodedBatch` per batch); :class:`DeviceAugmenter` builds the images from them."""

    def __getitem__(self, key: int | SampleKey) -> EncodedSample:  # type: ignore[override]
        index, epoch, mosaic = key if isinstance(key, tuple) else (key, self.epoch, self.mosaic)
        index = int(index)
        rng = np.random.default_rng([self.seed, int(epoch), index])
        hyp = self.hyp
        composites = []
        if mosaic and rng.random() < hyp.mosaic:
            composites.append(self._mosaic_draws(index, rng))
            if rng.random() < hyp.mixup:
                composites.append(self._mosaic_draws(int(rng.integers(len(self))), rng))
                ratio = rng.beta(32.0, 32.0)
                composites[0].weight, composites[1].weight = ratio, 1 - ratio
        else:
            loaded = loaded_size(self.shapes[index], self.img_size)
            _, resized, pad = letterbox_geometry(loaded, np.array([self.img_size] * 2))
            composites.append(Composite([index], [resized], [tuple(pad)], [(0, 0)], self.img_size,
                                        _warp_draws(rng, hyp)))
        gains = (hyp.hsv_h, hyp.hsv_s, hyp.hsv_v)
        hsv = rng.uniform(-1, 1, 3) * gains + 1 if any(gains) else np.ones(3)
        ud, lr = rng.random(2)
        data = [self.encoded(i) for composite in composites for i in composite.tiles]
        return EncodedSample(composites, hsv, (ud < hyp.flipud, lr < hyp.fliplr), data,
                             [exif_orientation(d) for d in data],
                             [self.labels[i] for composite in composites for i in composite.tiles])

    def _mosaic_draws(self, index: int, rng: np.random.Generator) -> Composite:
        """A mosaic's 4 images (``index`` and 3 random, shuffled), centre and warp, drawn as the loader does."""
        picks = rng.permutation(np.concatenate([[index], rng.integers(0, len(self), 3)]))
        yc, xc = (int(v) for v in rng.uniform(self.img_size / 2, 1.5 * self.img_size, 2))
        # Tiles 0..3 go top-left, top-right, bottom-left, bottom-right of the centre.
        sizes = [loaded_size(self.shapes[i], self.img_size) for i in picks]
        return Composite([int(i) for i in picks], sizes, [(xc, yc)] * 4, [(1, 1), (0, 1), (1, 0), (0, 0)],
                         2 * self.img_size, _warp_draws(rng, self.hyp))

    def encoded(self, index: int) -> torch.Tensor:
        """The file bytes of image ``index``, as a uint8 tensor."""
        path = self.im_files[index]
        try:
            return torch.from_numpy(np.fromfile(path, np.uint8))
        except OSError:
            raise ImageReadError(f"cannot read image {path}") from None

    @staticmethod
    def collate(samples: Sequence[EncodedSample]) -> EncodedBatch:  # type: ignore[override]
        """One :class:`EncodedBatch` of the samples, tile and composite numbers counted over the batch."""
        composites = [composite for sample in samples for composite in sample.composites]
        tiles = [(composite, slot) for composite in composites for slot in range(len(composite.tiles))]
        labels = [rows for sample in samples for rows in sample.labels]
        return EncodedBatch(
            data=[data for sample in samples for data in sample.data],
            tile_size=torch.tensor(np.array([c.size[slot] for c, slot in tiles]), dtype=torch.long),
            tile_anchor=torch.tensor([c.anchor[slot] for c, slot in tiles], dtype=torch.float64),
            tile_lead=torch.tensor([c.lead[slot] for c, slot in tiles], dtype=torch.float64),
            tile_slot=torch.tensor([slot for _, slot in tiles]),
            tile_composite=torch.repeat_interleave(torch.tensor([len(c.tiles) for c in composites])),
            tile_orientation=torch.tensor([o for sample in samples for o in sample.orientation]),
            labels=torch.from_numpy(np.concatenate(labels).astype(np.float64).reshape(-1, 5)),
            label_tile=torch.repeat_interleave(torch.tensor([len(rows) for rows in labels])),
            canvas=torch.tensor([c.canvas for c in composites], dtype=torch.float64),
            warp=torch.from_numpy(np.array([c.warp for c in composites])),
            composite_sample=torch.repeat_interleave(torch.tensor([len(sample.composites) for sample in samples])),
            composite_weight=torch.tensor([c.weight for c in composites], dtype=torch.float64),
            hsv_gain=torch.from_numpy(np.array([sample.hsv for sample in samples])),
            flip=torch.tensor([sample.flip for sample in samples], dtype=torch.bool))


def _warp_draws(rng: np.random.Generator, hyp: AugmentConfig) -> np.ndarray:
    """The random perspective's draws in the loader's order: perspective (2), angle, scale, shear (2),
    translation (2, fractions of the output side)."""
    perspective = rng.uniform(-hyp.perspective, hyp.perspective, 2)
    angle = rng.uniform(-hyp.degrees, hyp.degrees)
    scale = rng.uniform(1 - hyp.scale, 1 + hyp.scale)
    shear = rng.uniform(-hyp.shear, hyp.shear, 2)
    translate = rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate, 2)
    return np.array([*perspective, angle, scale, *shear, *translate])


def warp_matrices(warp: torch.Tensor, canvas: torch.Tensor, size: int) -> torch.Tensor:
    """``[K, 3, 3]`` canvas-to-output matrices of the draws ``warp`` ``[K, 8]`` (see :class:`EncodedBatch`):
    the loader's ``T @ S @ R @ P @ C`` (centre, perspective, rotation and scale, shear, translation)."""
    k = len(warp)
    eye = torch.eye(3, dtype=torch.float64, device=warp.device).expand(k, 3, 3)
    centre, perspective, rotation, shear, translation = (eye.clone() for _ in range(5))
    centre[:, 0, 2] = centre[:, 1, 2] = -canvas / 2
    perspective[:, 2, 0], perspective[:, 2, 1] = warp[:, 0], warp[:, 1]
    angle, scale = torch.deg2rad(warp[:, 2]), warp[:, 3]
    cos, sin = scale * torch.cos(angle), scale * torch.sin(angle)
    rotation[:, 0, 0], rotation[:, 0, 1], rotation[:, 1, 0], rotation[:, 1, 1] = cos, sin, -sin, cos
    shear[:, 0, 1], shear[:, 1, 0] = torch.tan(torch.deg2rad(warp[:, 4])), torch.tan(torch.deg2rad(warp[:, 5]))
    translation[:, 0, 2], translation[:, 1, 2] = warp[:, 6] * size, warp[:, 7] * size
    return translation @ shear @ rotation @ perspective @ centre


class DeviceAugmenter:
    """Builds a :class:`~yolotrain.data.batch.Batch` (``imgs`` ``[B,3,S,S]`` float 0..1, ``targets`` ``[N,6]``) on
    ``device`` from an :class:`EncodedBatch`, the batch :meth:`DetectionDataset.collate` would give for the same
    draws."""

    def __init__(self, hyp: AugmentConfig, img_size: int, device: torch.device | str) -> None:
        self.hyp = hyp
        self.size = int(img_size)
        self.device = torch.device(device)
        self.nvjpeg = self.device.type == "cuda" and nvjpeg_decodes(self.device)
        if self.device.type == "cuda" and not self.nvjpeg:
            warnings.warn("this torchvision cannot decode JPEGs on CUDA (no nvJPEG): --augment-device cuda decodes "
                          "them on the CPU", RuntimeWarning, stacklevel=2)

    def __call__(self, batch: EncodedBatch) -> Batch:
        batch = _to(batch, self.device)
        offsets = batch.tile_anchor - batch.tile_size * batch.tile_lead
        matrices = warp_matrices(batch.warp, batch.canvas, self.size)
        composites = self.warp_tiles(self.atlas(batch), batch, offsets, matrices)
        imgs = torch.zeros((len(batch.flip), *composites.shape[1:]), dtype=composites.dtype, device=self.device)
        weighted = composites * batch.composite_weight[:, None, None, None].float()
        imgs = imgs.index_add(0, batch.composite_sample, weighted)
        imgs = imgs.round()
        if any((self.hyp.hsv_h, self.hyp.hsv_s, self.hyp.hsv_v)):
            imgs = hsv_gains(imgs, batch.hsv_gain)
        flip = batch.flip[:, :, None, None, None]
        imgs = torch.where(flip[:, 0], imgs.flip(-2), imgs)
        imgs = torch.where(flip[:, 1], imgs.flip(-1), imgs)
        return Batch(imgs.div(255), self.targets(batch, offsets, matrices))

    def decode(self, data: Sequence[torch.Tensor], orientation: Sequence[int]) -> list[torch.Tensor]:
        """``[3, h, w]`` uint8 RGB images on the device: JPEGs batched through nvJPEG on CUDA, the rest
        (everything on other devices) decoded on the CPU; EXIF orientation applied as OpenCV's reader does
        (by :func:`orient` where nvJPEG leaves it aside)."""
        jpeg = [bytes(d[:3].tolist()) == _JPEG_MAGIC for d in data]
        images: list[torch.Tensor | None] = [None] * len(data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torchvision's pointer to TorchCodec
            if self.nvjpeg and any(jpeg):
                at = [i for i, j in enumerate(jpeg) if j]
                for i, im in zip(at, decode_jpeg([data[i] for i in at], mode=ImageReadMode.RGB, device=self.device)):
                    images[i] = orient(im, orientation[i])
            for i, d in enumerate(data):
                if images[i] is None:
                    images[i] = decode_image(d, mode=ImageReadMode.RGB, apply_exif_orientation=True).to(self.device)
        return images  # type: ignore[return-value]

    def atlas(self, batch: EncodedBatch) -> torch.Tensor:
        """``[K, 3, S+2, 4(S+2)]``: each composite's tiles resized (as the loader loads them) side by side,
        minus the pad value, so that sampling outside every tile gives the pad value back."""
        side = self.size + 2 * _FRAME
        atlas = torch.full((len(batch.canvas), 3, side, 4 * side), PAD_VALUE, dtype=torch.float32, device=self.device)
        for image, (w, h), slot, k in zip(self.decode(batch.data, batch.tile_orientation.tolist()),
                                          batch.tile_size.tolist(),
                                          batch.tile_slot.tolist(), batch.tile_composite.tolist()):
            if image.shape[-2:] != (h, w):
                image = resize(image, h, w)
            left = slot * side + _FRAME
            atlas[k, :, _FRAME:_FRAME + h, left:left + w] = image
        return atlas.sub_(PAD_VALUE)

    def warp_tiles(self, atlas: torch.Tensor, batch: EncodedBatch, offsets: torch.Tensor,
                   matrices: torch.Tensor) -> torch.Tensor:
        """``[K, 3, S, S]`` composites: each output pixel's canvas point (the inverse warp), the tile whose
        placement holds it, and one bilinear sample of the atlas there (integer values, as OpenCV's)."""
        k, s, side = len(matrices), self.size, self.size + 2 * _FRAME
        # Whole-pixel coordinates below 2^13 and matrices near unit scale: float32 keeps them to 1e-3 px.
        ys, xs = torch.meshgrid(torch.arange(s, device=self.device, dtype=torch.float32),
                                torch.arange(s, device=self.device, dtype=torch.float32), indexing="ij")
        pixels = torch.stack((xs, ys, torch.ones_like(xs)), -1).reshape(-1, 3)
        canvas = pixels @ torch.linalg.inv(matrices).transpose(1, 2).float()  # [K, S*S, 3]
        canvas = canvas[..., :2] / canvas[..., 2:]
        x, y = canvas[..., 0], canvas[..., 1]
        slot_offset = torch.zeros((k, 4, 2), device=self.device)
        slot_rect = torch.zeros((k, 4, 4), device=self.device)  # empty slots hold nothing
        size = batch.tile_size.double()
        limit = batch.canvas[batch.tile_composite, None]
        rect = torch.cat((offsets, offsets + size), 1).clamp(min=torch.zeros_like(limit), max=limit)
        slot_offset[batch.tile_composite, batch.tile_slot] = offsets.float()
        slot_rect[batch.tile_composite, batch.tile_slot] = rect.float()
        atlas_x = torch.full_like(x, -2.0 * side)  # outside the atlas: the zero padding, i.e. the pad value
        atlas_y = torch.zeros_like(y)
        for slot in range(4):
            x1, y1, x2, y2 = (slot_rect[:, slot, i, None] - 0.5 for i in range(4))
            inside = (x >= x1) & (x < x2) & (y >= y1) & (y < y2)
            atlas_x = torch.where(inside, x - slot_offset[:, slot, 0, None] + slot * side + _FRAME, atlas_x)
            atlas_y = torch.where(inside, y - slot_offset[:, slot, 1, None] + _FRAME, atlas_y)
        grid = torch.stack((atlas_x * (2 / (4 * side - 1)) - 1, atlas_y * (2 / (side - 1)) - 1), -1)
        sampled = F.grid_sample(atlas, grid.reshape(k, s, s, 2), mode="bilinear", padding_mode="zeros",
                                align_corners=True)
        return sampled.add_(PAD_VALUE).round_().clamp_(0, 255)

    def targets(self, batch: EncodedBatch, offsets: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
        """``[N, 6]`` (image, class, cx, cy, w, h normalised) of all boxes: placed on their canvas and clipped
        to it, warped by their 4 corners, clipped to the output, filtered by the candidate rule."""
        s = self.size
        tile, labels = batch.label_tile, batch.labels
        composite = batch.tile_composite[tile]
        size, offset = batch.tile_size[tile].double(), offsets[tile]
        half = labels[:, 3:5] / 2
        placed = torch.cat(((labels[:, 1:3] - half) * size + offset, (labels[:, 1:3] + half) * size + offset), 1)
        placed = placed.clamp(min=torch.zeros((1, 1), dtype=placed.dtype, device=self.device),
                              max=batch.canvas[composite, None])
        corners = placed[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(-1, 4, 2)
        corners = torch.cat((corners, torch.ones_like(corners[..., :1])), -1) @ matrices[composite].transpose(1, 2)
        corners = corners[..., :2] / corners[..., 2:]
        warped = torch.cat((corners.amin(1), corners.amax(1)), 1).clamp(0, s)
        keep = box_candidates(placed * batch.warp[composite, 3, None], warped)
        xyxy = warped[keep].clamp(0, s - 1e-3)
        image = batch.composite_sample[composite[keep]]
        flip = batch.flip[image]
        centre = (xyxy[:, :2] + xyxy[:, 2:]) / (2 * s)
        centre[:, 1] = torch.where(flip[:, 0], 1 - centre[:, 1], centre[:, 1])
        centre[:, 0] = torch.where(flip[:, 1], 1 - centre[:, 0], centre[:, 0])
        targets = torch.cat((image[:, None].double(), labels[keep, :1], centre, (xyxy[:, 2:] - xyxy[:, :2]) / s), 1)
        return targets[torch.argsort(image, stable=True)].float()


def exif_orientation(data: torch.Tensor) -> int:
    """The EXIF orientation (1..8; 1 when none) of the encoded JPEG ``data``; 1 for other formats."""
    if bytes(data[:3].tolist()) != _JPEG_MAGIC:
        return 1
    try:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as im:
            orientation = im.getexif().get(_EXIF_ORIENTATION, 1)
    except (OSError, SyntaxError, ValueError):  # an unreadable EXIF block: the pixels as stored
        return 1
    return orientation if orientation in range(1, 9) else 1


def orient(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """``[C, h, w]`` pixels as stored turned upright per their EXIF ``orientation`` (PIL's ``exif_transpose``)."""
    turns = {2: lambda t: t.flip(-1), 3: lambda t: t.flip(-2, -1), 4: lambda t: t.flip(-2),
             5: lambda t: t.transpose(-2, -1), 6: lambda t: t.rot90(-1, (-2, -1)),
             7: lambda t: t.transpose(-2, -1).flip(-2, -1), 8: lambda t: t.rot90(1, (-2, -1))}
    return turns[orientation](image).contiguous() if orientation in turns else image


def nvjpeg_decodes(device: torch.device) -> bool:
    """Whether torchvision decodes JPEGs on the CUDA ``device`` (builds without nvJPEG exist)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torchvision's pointer to TorchCodec
        probe = encode_jpeg(torch.zeros((3, 8, 8), dtype=torch.uint8))
        try:
            decode_jpeg([probe], device=device)
        except RuntimeError:
            return False
    return True


def resize(image: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``image`` ``[3, h0, w0]`` uint8 resized to ``h`` x ``w`` (bilinear, antialiased when shrinking), whole
    values as the loader's uint8 images: in uint8 on the CPU (its fast path), in float elsewhere."""
    if image.device.type == "cpu":
        return F.interpolate(image[None], size=(h, w), mode="bilinear", antialias=True)[0]
    return F.interpolate(image[None].float(), size=(h, w), mode="bilinear", antialias=True)[0].round_()


def box_candidates(before: torch.Tensor, after: torch.Tensor, eps: float = 1e-16) -> torch.Tensor:
    """:func:`yolotrain.data.augment.box_candidates` on ``[n, 4]`` xyxy tensors: the boxes worth keeping."""
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    aspect = torch.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > _MIN_SIDE) & (h2 > _MIN_SIDE) & (w2 * h2 / (w1 * h1 + eps) > _MIN_AREA_KEPT) & (aspect < _MAX_ASPECT)


def hsv_gains(imgs: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """RGB images ``[B, 3, H, W]`` (integer values 0..255, float) with per-image HSV ``gains`` ``[B, 3]``
    applied as the loader does: OpenCV's 8-bit HSV, through each image's lookup tables of the gains (hue
    wrapped at 180, saturation and value clipped, truncated to integers, in float64 as the loader's), and
    back to RGB."""
    levels = torch.arange(256, dtype=torch.float64, device=imgs.device)
    tables = levels * gains.to(torch.float64)[:, :, None]  # [B, 3, 256]
    tables = torch.cat((tables[:, :1].remainder(180), tables[:, 1:].clamp(0, 255)), 1).floor_()
    hsv = rgb_to_hsv8(imgs).long()
    return hsv8_to_rgb(tables.gather(2, hsv.flatten(2)).view(hsv.shape))


def rgb_to_hsv8(imgs: torch.Tensor) -> torch.Tensor:
    """OpenCV's ``COLOR_RGB2HSV`` of 8-bit images (hue 0..179, saturation and value 0..255), in its
    fixed-point arithmetic: a hue one step off would move a saturated colour by several levels."""
    r, g, b = imgs.round().int().unbind(1)
    value = torch.maximum(torch.maximum(r, g), b)
    spread = value - torch.minimum(torch.minimum(r, g), b)
    hue = torch.where(value == r, g - b, torch.where(value == g, b - r + 2 * spread, r - g + 4 * spread))
    half = 1 << (_HSV_SHIFT - 1)
    hue = (hue * _HUE_DIVISORS.to(imgs.device)[spread] + half) >> _HSV_SHIFT
    hue = torch.where(hue < 0, hue + 180, hue)
    saturation = (spread * _SATURATION_DIVISORS.to(imgs.device)[value] + half) >> _HSV_SHIFT
    return torch.stack((hue, saturation, value), 1)


def hsv8_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """OpenCV's ``COLOR_HSV2RGB`` of 8-bit HSV, in its float32 arithmetic: the hue's sector and the fraction
    into it pick each channel among v, v (1 - s), v (1 - s f) and v (1 - s (1 - f)), truncated to 8 bits as
    its vectorised code (the one whole images take) does."""
    hue, saturation, value = hsv.float().unbind(1)
    hue = torch.fmod(hue * torch.tensor(6 / 180), 6)
    sector = hue.floor()
    fraction = hue - sector
    saturation, value = saturation * torch.tensor(1 / 255), value * torch.tensor(1 / 255)
    table = torch.stack((value, value * (1 - saturation), value * (1 - saturation * fraction),
                         value * (1 - saturation * (1 - fraction))), 1)
    pick = _SECTOR_CHANNELS.to(hsv.device)[sector.long()].permute(0, 3, 1, 2)  # [B, 3, H, W] rows of the table
    return (table.gather(1, pick) * 255).floor_()


def _to(batch: EncodedBatch, device: torch.device) -> EncodedBatch:
    """The batch's numbers on ``device`` (the encoded bytes stay on the CPU, where the decoders read them)."""
    fields = {name: value.to(device, non_blocking=True) for name, value in vars(batch).items()
              if isinstance(value, torch.Tensor)}
    return EncodedBatch(data=batch.data, **fields)


class DeviceAugmentLoader(DataLoader):
    """The training DataLoader of an :class:`EncodedDetectionDataset`, its batches built on the device by
    ``augmenter`` as they are taken."""

    def __init__(self, loader: DataLoader, augmenter: DeviceAugmenter) -> None:
        # The dataset's own collate: the loader's collates images into float batches, which these samples are not.
        super().__init__(loader.dataset, batch_sampler=loader.batch_sampler, num_workers=loader.num_workers,
                         collate_fn=loader.dataset.collate, persistent_workers=loader.persistent_workers)
        self.augmenter = augmenter

    def __iter__(self) -> Iterator[Batch]:  # type: ignore[override]
        return map(self.augmenter, super().__iter__())
