"""The pose dataset: the detection dataset's images and boxes, each box with its keypoints, moved with the pixels.

As Ultralytics' pose data: keypoints are placed by the mosaic and letterbox and warped by the random perspective
with the boxes (the rows the box filter drops take their keypoints with them); a keypoint that leaves the image
is marked not visible and clipped to its edge; every flip (each one mirrors the image) renumbers the keypoints by
the dataset's ``flip_idx``, so a left wrist stays a left wrist.

Keypoints travel as ``(n, K, 3)`` (x, y, visibility) whatever the dataset's D; a dataset of D = 2 (x, y only)
reads a keypoint at (0, 0) as absent and writes absent keypoints as (0, 0).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import torch

from . import augment as A
from .batch import Batch
from .dataset import BatchBuffers, DetectionDataset, SampleKey
from .sources import KeypointLayout
from .verify import DataWarning, LabelIndex

PoseItem = tuple[np.ndarray, np.ndarray, np.ndarray]  # image, labels (n, 5), keypoints (n, K, D)


class PoseDataset(DetectionDataset):
    """Items are ``(image HWC uint8 RGB, labels (n, 5), keypoints (n, K, D))``, the keypoints' x, y normalised to
    the item's image and their visibility (D = 3) as in the label files, 0 for a keypoint moved out of the image;
    :meth:`collate` gives a :class:`PoseBatch`.

    ``index`` must come from :func:`~yolotrain.data.verify.verify_split` with the layout's ``kpt_shape``. Without
    a ``flip_idx`` the flips are turned off (one :class:`DataWarning`): a mirrored person's left and right
    keypoints would be misnamed. Other arguments as :class:`DetectionDataset`.
    """

    def __init__(self, index: LabelIndex, *args, layout: KeypointLayout, **kwargs) -> None:
        if index.keypoints is None:
            raise ValueError("the split was verified without kpt_shape: its label rows were not read as keypoints")
        super().__init__(index, *args, **kwargs)
        self.layout = layout
        self.flip_idx = None if layout.flip_idx is None else np.array(layout.flip_idx)
        if self.augment and self.flip_idx is None and (self.hyp.fliplr or self.hyp.flipud):
            warnings.warn("the dataset YAML has no 'flip_idx' (the keypoint each keypoint becomes in a mirrored "
                          "image): flips turned off", DataWarning, stacklevel=2)
            self.hyp = dataclasses.replace(self.hyp, fliplr=0.0, flipud=0.0)
        self.keypoints: list[np.ndarray] = [with_visibility(index.keypoints[i]) for i in self.order]

    def _placed(self, index: int, size: tuple[int, int], offset: tuple[float, float]) -> np.ndarray:
        points = self.keypoints[index].copy()
        points[..., :2] = points[..., :2] * size + offset
        return points

    def _mosaic(self, index: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        picks = rng.permutation(np.concatenate([[index], rng.integers(0, len(self), 3)]))
        placements: list[tuple[int, int, int, int]] = []
        canvas, labels = A.mosaic4([(self.load_image(i), self.labels[i]) for i in picks], self.img_size, rng,
                                   placements=placements)
        points = np.concatenate([self._placed(i, (w, h), (x, y)) for i, (w, h, x, y) in zip(picks, placements)])
        points = hide_outside(points, canvas.shape[1], canvas.shape[0])
        border = -self.img_size // 2
        return random_perspective_keypoints(canvas, labels, points, rng, self.hyp, border=(border, border))

    @staticmethod
    def _joined(geometry: np.ndarray, other: np.ndarray) -> np.ndarray:
        return np.concatenate((geometry, other))

    def _perspective(self, img: np.ndarray, labels: np.ndarray, geometry: np.ndarray,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return random_perspective_keypoints(img, labels, geometry, rng, self.hyp)

    def __getitem__(self, key: int | SampleKey) -> PoseItem:
        _, img, labels, points, rng, _ = self._compose(key)
        height, width = img.shape[:2]
        labels = A.xyxy_to_xywhn(labels, width, height)
        points[..., :2] /= (width, height)
        if self.augment:
            img = A.hsv_to_rgb(img, rng, self.hyp.hsv_h, self.hyp.hsv_s, self.hyp.hsv_v)
            img, labels, points = random_flips(img, labels, points, rng, self.hyp.flipud, self.hyp.fliplr,
                                               self.flip_idx)
        else:
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        return img, labels, label_keypoints(points, self.layout.dims)

    @staticmethod
    def collate(batch: Sequence[PoseItem], uint8: bool = False, buffers: BatchBuffers | None = None) -> PoseBatch:
        """``imgs`` and ``targets`` as :meth:`DetectionDataset.collate` (``uint8``, ``buffers`` as there) and the
        rows' keypoints ``[N, K, D]`` in the rows' order."""
        imgs, targets = DetectionDataset.collate([item[:2] for item in batch], uint8, buffers)
        keypoints = torch.from_numpy(np.concatenate([item[2] for item in batch]).astype(np.float32))
        return PoseBatch(imgs, targets, keypoints)


@dataclass
class PoseBatch(Batch):
    """A pose batch: a detection :class:`~yolotrain.data.batch.Batch` with its rows' ``keypoints`` ``[N, K, D]``
    (x, y normalised to the batch image; D = 3: the visibility 0, 1 or 2, 0 for a keypoint out of the image;
    D = 2: an absent keypoint is (0, 0)), row ``i`` of ``keypoints`` belonging to row ``i`` of ``targets``."""

    keypoints: torch.Tensor


def with_visibility(keypoints: np.ndarray) -> np.ndarray:
    """Label keypoints ``(n, K, D)`` as ``(n, K, 3)`` float64: D = 2 gains a visibility, 0 for a keypoint at (0, 0)
    (the mark of an absent one), else 2."""
    if keypoints.shape[-1] == 3:
        return keypoints.astype(np.float64)
    absent = (keypoints == 0).all(-1, keepdims=True)
    return np.concatenate((keypoints, np.where(absent, 0.0, 2.0)), -1).astype(np.float64)


def label_keypoints(keypoints: np.ndarray, dims: int) -> np.ndarray:
    """Keypoints ``(n, K, 3)`` back in the dataset's D values as float32: D = 2 writes absent ones as (0, 0)."""
    if dims == 3:
        return keypoints.astype(np.float32)
    return np.where(keypoints[..., 2:] > 0, keypoints[..., :2], 0.0).astype(np.float32)


def hide_outside(keypoints: np.ndarray, width: float, height: float) -> np.ndarray:
    """Pixel keypoints ``(n, K, 3)`` with those outside the ``width`` x ``height`` image not visible (0) and every
    keypoint clipped to the image (Ultralytics' rule)."""
    x, y = keypoints[..., 0], keypoints[..., 1]
    outside = (x < 0) | (y < 0) | (x > width) | (y > height)
    return np.stack((x.clip(0, width), y.clip(0, height), np.where(outside, 0.0, keypoints[..., 2])), -1)


def random_perspective_keypoints(
    im: np.ndarray, labels: np.ndarray, keypoints: np.ndarray, rng: np.random.Generator, hyp: A.AugmentConfig,
    border: tuple[int, int] = (0, 0),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~yolotrain.data.augment.random_perspective` (the same draws and boxes) moving each row's pixel
    keypoints ``(n, K, 3)`` with the image: the rows the box filter drops go with their keypoints, and keypoints
    out of the warped image are hidden (:func:`hide_outside`)."""
    im, M, s, perspective = A.random_warp(im, rng, hyp, border)
    height, width = im.shape[:2]
    new, keep = A.warped_boxes(labels, M, s, perspective, width, height)
    moved = np.concatenate((A.warp_points(keypoints[..., :2], M, perspective), keypoints[..., 2:]), -1)
    labels = labels[keep]
    labels[:, 1:5] = new[keep]
    return im, labels, hide_outside(moved[keep], width, height)


def random_flips(im: np.ndarray, labels: np.ndarray, keypoints: np.ndarray, rng: np.random.Generator, flipud: float,
                 fliplr: float, flip_idx: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~yolotrain.data.augment.random_flips` (the same draws) flipping the normalised keypoints ``(n, K, 3)``
    with the image and renumbering them by ``flip_idx`` after each flip (both mirror the image, as Ultralytics
    has it); the caller turns the flips off without a ``flip_idx``."""
    ud, lr = rng.random(2)
    if ud < flipud:
        im = cv2.flip(im, 0)
        labels[:, 2] = 1 - labels[:, 2]
        keypoints = np.concatenate((keypoints[..., :1], 1 - keypoints[..., 1:2], keypoints[..., 2:]), -1)[:, flip_idx]
    if lr < fliplr:
        im = cv2.flip(im, 1)
        labels[:, 1] = 1 - labels[:, 1]
        keypoints = np.concatenate((1 - keypoints[..., :1], keypoints[..., 1:]), -1)[:, flip_idx]
    return im, labels, keypoints
