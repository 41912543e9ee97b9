"""The segmentation dataset: the detection dataset's images and boxes, each box with its polygon, warped
with the pixels, and the target masks drawn from the polygons at ``1 / mask_ratio`` of the image size.

As the reference's ``LoadImagesAndLabelsAndMasks``: polygons are placed by the mosaic and letterbox,
resampled and warped by the random perspective (their boxes follow the warped points), optionally
copy-pasted; masks are filled at full size and resized; flips flip the masks. With ``overlap`` an image's
masks are one map whose pixels hold the 1-based row of the target within the image (smaller objects
drawn over larger ones, the rows sorted by mask area, largest first), else one binary mask per row.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from . import augment as A
from .batch import Batch
from .dataset import BatchBuffers, DetectionDataset, SampleKey
from .verify import DataWarning, LabelIndex

DEFAULT_MASK_RATIO = 4


class SegmentationDataset(DetectionDataset):
    """Items are ``(image HWC uint8 RGB, labels (n, 5), path, shapes, masks)`` with masks ``[1, h, w]``
    (overlap) or ``[n, h, w]``, ``h, w`` the image's sides over ``mask_ratio``, and ``shapes`` the
    reference's ``((h0, w0), ((h / h0, w / w0), (pad w, pad h)))`` of a letterboxed image (None for a
    mosaic); :meth:`collate` gives the reference's batch ``(imgs, targets [N, 6], paths, shapes,
    masks [B, h, w] or [N, h, w])``.

    Box-only label rows (no polygon) are left out, as the reference's overlap masks leave them out; how
    many is said in one :class:`DataWarning`. Other arguments as :class:`DetectionDataset`.
    """

    def __init__(self, index: LabelIndex, *args, overlap: bool = True, mask_ratio: int = DEFAULT_MASK_RATIO,
                 **kwargs) -> None:
        self.overlap = overlap
        self.mask_ratio = int(mask_ratio)
        box_only = [(i, sum(len(p) == 0 for p in rows)) for i, rows in enumerate(index.segments)]
        dropped = [(index.files[i], n) for i, n in box_only if n]
        if dropped:
            examples = ", ".join(f"{path.name} ({n})" for path, n in dropped[:3])
            warnings.warn(f"{sum(n for _, n in dropped)} box-only label rows in {len(dropped)} images have no polygon "
                          f"and are left out of segmentation training: {examples}", DataWarning, stacklevel=2)
        keep = [np.array([len(p) > 0 for p in rows], bool) for rows in index.segments]
        index = LabelIndex(index.files, [rows[k] for rows, k in zip(index.labels, keep)], index.shapes, index.report,
                           [[p for p in rows if len(p)] for rows in index.segments])
        super().__init__(index, *args, **kwargs)
        self.segments: list[list[np.ndarray]] = [index.segments[i] for i in self.order]

    def _mosaic(self, index: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        picks = rng.permutation(np.concatenate([[index], rng.integers(0, len(self), 3)]))
        segments: list[np.ndarray] = []
        canvas, labels = A.mosaic4([(self.load_image(i), self.labels[i], self.segments[i]) for i in picks],
                                   self.img_size, rng, segments=segments)
        canvas, labels, segments = A.copy_paste(canvas, labels, segments, self.hyp.copy_paste, rng)
        border = -self.img_size // 2
        return A.random_perspective_segments(canvas, labels, segments, rng, self.hyp, border=(border, border))

    def _placed(self, index: int, size: tuple[int, int], offset: tuple[float, float]) -> list[np.ndarray]:
        return [p * size + offset for p in self.segments[index]]

    @staticmethod
    def _joined(geometry: list[np.ndarray], other: list[np.ndarray]) -> list[np.ndarray]:
        return [*geometry, *other]

    def _perspective(self, img: np.ndarray, labels: np.ndarray, geometry: list[np.ndarray],
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        return A.random_perspective_segments(img, labels, geometry, rng, self.hyp)

    def __getitem__(self, key: int | SampleKey) -> tuple[np.ndarray, np.ndarray, Path, Any, np.ndarray]:
        index, img, labels, segments, rng, letterbox = self._compose(key)
        shapes = None
        if letterbox is not None:
            (h, w), pad = letterbox
            w0, h0 = (int(v) for v in self.shapes[index])
            shapes = (h0, w0), ((h / h0, w / w0), pad)
        labels = A.xyxy_to_xywhn(labels, img.shape[1], img.shape[0])
        masks, order = polygon_masks(img.shape[:2], segments, self.mask_ratio, self.overlap)
        labels = labels[order]
        if self.augment:
            img = A.hsv_to_rgb(img, rng, self.hyp.hsv_h, self.hyp.hsv_s, self.hyp.hsv_v)
            img, labels, masks = random_flips(img, labels, masks, rng, self.hyp.flipud, self.hyp.fliplr)
        else:
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        return img, labels, self.im_files[index], shapes, masks

    @staticmethod
    def collate(batch: Sequence[tuple[np.ndarray, np.ndarray, Path, Any, np.ndarray]], uint8: bool = False,
                buffers: BatchBuffers | None = None) -> SegmentBatch:
        """``imgs`` and ``targets`` as :meth:`DetectionDataset.collate` (``uint8``, ``buffers`` as there), the paths
        and shapes of the images, and their masks concatenated: ``[B, h, w]`` overlap maps or ``[N, h, w]`` binary
        masks."""
        imgs, targets = DetectionDataset.collate([item[:2] for item in batch], uint8, buffers)
        masks = torch.from_numpy(np.concatenate([item[4] for item in batch]).astype(np.float32))
        return SegmentBatch(imgs, targets, [item[2] for item in batch], [item[3] for item in batch], masks)


@dataclass
class SegmentBatch(Batch):
    """A segmentation batch: a detection :class:`~yolotrain.data.batch.Batch` with its images' ``paths`` and
    ``shapes`` (original size, letterbox ratio and padding) and its labels' ``masks``: ``[B, h, w]`` overlap maps
    (value k + 1: the image's k-th label) or ``[N, h, w]`` binary masks in the rows' order."""

    paths: list[Path]
    shapes: list[Any]
    masks: torch.Tensor


def polygon_mask(shape: tuple[int, int], polygon: np.ndarray, ratio: int) -> np.ndarray:
    """One polygon (pixels) filled at full size ``shape`` (h, w), then resized to ``shape // ratio``: the
    reference's order, so that a ratio of 1 gives the same pixels as the loss at full size."""
    mask = np.zeros(shape, np.uint8)
    cv2.fillPoly(mask, [polygon.astype(np.int32)], color=1)
    return cv2.resize(mask, (shape[1] // ratio, shape[0] // ratio))


def polygon_masks(shape: tuple[int, int], segments: Sequence[np.ndarray], ratio: int,
                  overlap: bool) -> tuple[np.ndarray, np.ndarray]:
    """The masks of an image's polygons and the order its label rows must take to match them.

    ``overlap``: one ``[1, h, w]`` map, rows sorted by mask area (largest first, the reference's sort),
    row ``k`` painted as ``k + 1`` over the rows before it; else ``[n, h, w]`` binary masks in row order.
    """
    h, w = shape[0] // ratio, shape[1] // ratio
    masks = np.stack([polygon_mask(shape, p, ratio) for p in segments]) if len(segments) else \
        np.zeros((0, h, w), np.uint8)
    if not overlap:
        return masks, np.arange(len(segments))
    order = np.argsort(-masks.sum((1, 2)))
    numbered = masks[order].astype(np.int32) * np.arange(1, len(order) + 1)[:, None, None]
    # The last row that covers a pixel names it: smaller objects (later rows) stay visible.
    painted = numbered.max(0, initial=0) if len(order) else np.zeros((h, w), np.int32)
    return painted[None].astype(np.int32 if len(order) > 255 else np.uint8), order


def random_flips(im: np.ndarray, labels: np.ndarray, masks: np.ndarray, rng: np.random.Generator, flipud: float,
                 fliplr: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~yolotrain.data.augment.random_flips` (the same draws) flipping the masks with the image."""
    ud, lr = rng.random(2)
    if ud < flipud:
        im, masks = cv2.flip(im, 0), masks[:, ::-1]
        labels[:, 2] = 1 - labels[:, 2]
    if lr < fliplr:
        im, masks = cv2.flip(im, 1), masks[:, :, ::-1]
        labels[:, 1] = 1 - labels[:, 1]
    return im, labels, np.ascontiguousarray(masks)
