"""The detection dataset: loads verified images, augments them and collates batches.

Sample randomness comes from a generator seeded by (seed, epoch, index), so a sample does not
depend on which worker builds it or on global random state. The epoch and the mosaic switch travel
with each index (see :class:`yolotrain.data.loaders.EpochBatchSampler`) because persistent worker
processes keep their own copy of the dataset and would not see later changes to it.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info
from tqdm import tqdm

from . import augment as A
from .batch import Batch
from .imagecache import disk_cache
from .sample_threads import map_samples
from .verify import LabelIndex

# JPEG decoders can scale by 1/2, 1/4, 1/8 while decoding (libjpeg's DCT scaling), far cheaper than decoding
# every pixel and resizing; other formats have no such mode.
_REDUCED_FLAGS = (
    (8, cv2.IMREAD_REDUCED_COLOR_8), (4, cv2.IMREAD_REDUCED_COLOR_4), (2, cv2.IMREAD_REDUCED_COLOR_2)
)
JPEG_SUFFIXES = frozenset({".jpg", ".jpeg"})
# EXIF orientations that turn the stored pixels by a quarter (OpenCV's reader applies them): width and height swap.
_EXIF_ORIENTATION = 0x0112
_TRANSPOSING_ORIENTATIONS = frozenset({5, 6, 7, 8})


def decode_flag(path: Path, scale: float, reduced: bool = True) -> int:
    """The ``cv2.imread`` flag for an image at ``path`` that will be used at ``scale`` times its size (BGR).

    With ``reduced`` a JPEG at least twice the size it is used at is decoded at the largest of 1/2, 1/4
    and 1/8 that still leaves it at or above that size, so resizing afterwards only ever shrinks it a
    little; anything else (other formats, smaller images, ``reduced`` off) is decoded at full size.
    """
    if reduced and path.suffix.lower() in JPEG_SUFFIXES:
        return next((flag for factor, flag in _REDUCED_FLAGS if scale * factor <= 1), cv2.IMREAD_COLOR)
    return cv2.IMREAD_COLOR


def read_image(path: Path, scale: float, reduced: bool = True) -> np.ndarray | None:
    """The image at ``path`` (BGR), decoded as :func:`decode_flag` says: possibly smaller than the file
    but never smaller than ``scale`` times it; ``None`` when OpenCV cannot read it."""
    return cv2.imread(str(path), decode_flag(path, scale, reduced))


def reduction_factor(flag: int) -> int:
    """How many times smaller each side comes out of ``cv2.imread`` with the :func:`decode_flag` ``flag`` (1: full)."""
    return next((factor for factor, reduced in _REDUCED_FLAGS if reduced == flag), 1)


def decoded_size(path: Path) -> tuple[int, int] | None:
    """(h, w) of the image at ``path`` as a full ``cv2.imread`` gives it (EXIF orientation applied), from the
    file's header alone; None when Pillow cannot read the header."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            width, height = im.size
            orientation = im.getexif().get(_EXIF_ORIENTATION, 1) if path.suffix.lower() in JPEG_SUFFIXES else 1
    except Exception:  # noqa: BLE001 - Pillow signals unreadable headers with many exception types
        return None
    return (width, height) if orientation in _TRANSPOSING_ORIENTATIONS else (height, width)


SampleKey = tuple[int, int, bool]  # (index, epoch, mosaic enabled)


class ComposedSample(NamedTuple):
    """A sample after mosaic or letterbox (:meth:`DetectionDataset._compose`): ``labels`` pixel xyxy rows,
    ``geometry`` their polygons or keypoints in pixels (None for boxes alone), ``rng`` the sample's generator for
    the augmentations still to come, ``letterbox`` the loaded image's ``(h, w)`` and the padding ``(x, y)`` when
    it was letterboxed (None for a mosaic)."""

    index: int
    img: np.ndarray
    labels: np.ndarray
    geometry: Any
    rng: np.random.Generator
    letterbox: tuple[tuple[int, int], tuple[float, float]] | None
DEFAULT_CACHE_MB = 512


class ImageReadError(OSError):
    """An image that passed verification can no longer be read: moved, deleted or replaced since."""


def _unreadable(path: Path, what: str) -> ImageReadError:
    """The error for ``path`` that cannot be read, naming the highest folder that no longer exists."""
    gone = path
    while not gone.parent.exists() and gone.parent != gone:
        gone = gone.parent
    if not gone.exists():
        return ImageReadError(f"cannot read {what} {path}: {gone} no longer exists")
    return ImageReadError(f"cannot read {what} {path}")


class _ImageCache:
    """Least-recently-used store of decoded, resized images within a byte budget.

    Mosaic reads 4 images per sample, so on datasets that fit the budget most reads become hits and
    decoding (the dominant cost) nearly disappears; on large datasets it degrades to a small hit rate
    at no extra cost. Each worker process keeps its own.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # a batch's samples may be built on threads (see sample_threads)

    def get(self, key: int) -> np.ndarray | None:
        with self._lock:
            im = self._items.get(key)
            if im is not None:
                self._items.move_to_end(key)
            return im

    def put(self, key: int, im: np.ndarray) -> None:
        if im.nbytes > self.max_bytes:
            return
        with self._lock:
            if key in self._items:  # another thread loaded the same image meanwhile
                return
            self._items[key] = im
            self.nbytes += im.nbytes
            while self.nbytes > self.max_bytes:
                self.nbytes -= self._items.popitem(last=False)[1].nbytes

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]  # a lock cannot be pickled: loader processes get a copy of the dataset
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


class DetectionDataset(Dataset):
    """Images and YOLO labels of one split, with training augmentations or plain letterboxing.

    Items are ``(image HWC uint8 RGB, labels (n, 5) float32 class + normalised cx, cy, w, h)``;
    :meth:`collate` turns a list of items into ``(imgs [B,3,H,W] float32 0..1, targets [N,6])``.

    Args:
        index: verified files, labels and sizes of the split.
        img_size: training/eval image size (long side, pixels).
        batch_size: batch size, needed to compute rectangular batch shapes.
        augment: apply augmentations (mosaic, affine, HSV, flips, mixup per ``hyp``).
        hyp: augmentation settings, an :class:`~yolotrain.data.augment.AugmentConfig` or a mapping of
            overrides of its defaults.
        rect: sort images by aspect ratio and give each batch its own padded shape (disables mosaic).
        pad: extra stride fraction added to rectangular shapes (reference: 0.0 train, 0.5 val).
        stride: shapes are multiples of this.
        seed: base seed of all sample randomness.
        names: class names.
        cache_mb: per-process budget (MiB) for keeping decoded images in memory; 0 disables it.
        cache: ``ram`` decodes every image now and keeps them all (worker processes share the copy),
            ``disk`` reads images from decoded ``.npy`` arrays (see :mod:`.imagecache`), ``off`` only
            the ``cache_mb`` budget.
        reduced_decode: decode JPEGs at least twice ``img_size`` at 1/2, 1/4 or 1/8 scale before resizing (see
            :func:`decode_flag`); off: every image decoded at full size, the reference's pixels.
        threads: threads that build a batch's samples when the loader has no worker processes (see
            :mod:`.sample_threads`); the samples are the same for any number.
    """

    def __init__(
        self,
        index: LabelIndex,
        img_size: int = 640,
        batch_size: int = 16,
        augment: bool = False,
        hyp: A.AugmentConfig | Mapping[str, float] | None = None,
        rect: bool = False,
        pad: float = 0.0,
        stride: int = 32,
        seed: int = 0,
        names: Sequence[str] = (),
        cache_mb: float = DEFAULT_CACHE_MB,
        cache: str = "off",
        reduced_decode: bool = True,
        threads: int = 1,
    ) -> None:
        self.img_size = int(img_size)
        self.threads = max(1, int(threads))
        self.augment = augment
        self.hyp = A.AugmentConfig.coerce(hyp)
        self.rect = rect
        self.stride = stride
        self.seed = int(seed)
        self.names = list(names)
        self.reduced_decode = reduced_decode
        self.epoch = 0
        self.mosaic = augment and not rect and self.hyp.mosaic > 0
        self.report = index.report
        self._cache = _ImageCache(int(cache_mb * 2**20))
        files, labels, shapes = list(index.files), list(index.labels), np.asarray(index.shapes).reshape(-1, 2)
        n = len(files)
        self.batch = np.arange(n) // batch_size
        self.order = np.arange(n)  # the position in ``index`` of each sample
        if rect:
            order = self.order = np.argsort(shapes[:, 1] / shapes[:, 0], kind="stable")
            files, labels, shapes = [files[i] for i in order], [labels[i] for i in order], shapes[order]
            self.batch_shapes = rect_batch_shapes(shapes, batch_size, self.img_size, stride, pad)
        self.im_files: list[Path] = files
        self.labels: list[np.ndarray] = labels
        self.shapes: np.ndarray = shapes  # original (w, h)
        self._arrays: list[Path] | None = None
        if cache == "disk":
            self._arrays = disk_cache(files)
        elif cache == "ram":
            self._cache = _ImageCache(1 << 62)
            for i in tqdm(range(n), desc="Caching decoded images in memory", leave=False, disable=n < 2):
                self.load_image(i)
        elif cache != "off":
            raise ValueError(f"cache must be 'ram', 'disk' or 'off', got {cache!r}")

    def __len__(self) -> int:
        return len(self.im_files)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose random stream the next iteration uses."""
        self.epoch = int(epoch)

    def close_mosaic(self) -> None:
        """Turn mosaic off for the rest of training (the usual last-epochs fine-tuning)."""
        self.mosaic = False

    def output_shape(self, index: int) -> tuple[int, int]:
        """(h, w) of sample ``index`` when not built by mosaic."""
        if self.rect:
            h, w = self.batch_shapes[self.batch[index]]
            return int(h), int(w)
        return self.img_size, self.img_size

    def load_image(self, index: int) -> np.ndarray:
        """Read image ``index`` (BGR) resized so its long side is ``img_size``.

        Raises:
            ImageReadError: the file can no longer be read (it passed verification earlier).
        """
        cached = self._cache.get(index)
        if cached is not None:
            return cached
        path = self.im_files[index]
        w0, h0 = (int(v) for v in self.shapes[index])
        r = self.img_size / max(h0, w0)
        size = tuple(int(v) for v in loaded_size(np.array([w0, h0]), self.img_size))
        if self._arrays is not None:
            try:
                im = np.load(self._arrays[index])
            except (OSError, ValueError):
                raise _unreadable(self._arrays[index], f"the decoded array of {path.name}") from None
        else:
            # Checked first: OpenCV prints a warning of its own for a file that is not there.
            im = read_image(path, r, self.reduced_decode) if path.is_file() else None
            if im is None:
                raise _unreadable(path, "image")
        if im.shape[1::-1] != size:
            interp = cv2.INTER_LINEAR if (self.augment or r > 1) else cv2.INTER_AREA
            im = cv2.resize(im, size, interpolation=interp)
        im.flags.writeable = False  # shared with the cache: augmentations must copy, never edit in place
        self._cache.put(index, im)
        return im

    def _mosaic(self, index: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, Any]:
        """A mosaic of image ``index`` and three drawn ones: the canvas, its pixel xyxy label rows and their geometry
        (see :meth:`_compose`)."""
        picks = rng.permutation(np.concatenate([[index], rng.integers(0, len(self), 3)]))
        sizes = loaded_size(self.shapes[picks], self.img_size).astype(int)
        tiles = [((h, w), self.labels[i]) for i, (w, h) in zip(picks, sizes)]
        return *A.mosaic_warp(tiles, lambda k: self.load_image(int(picks[k])), self.img_size, rng, self.hyp), None

    def _placed(self, index: int, size: tuple[int, int], offset: tuple[float, float]) -> Any:
        """Image ``index``'s label geometry in pixels of the image drawn at ``size`` (w, h) with its corner at
        ``offset``: nothing beyond the boxes here."""
        return None

    @staticmethod
    def _joined(geometry: Any, other: Any) -> Any:
        """The geometry of two mixed-up samples' rows, in the rows' order."""
        return None

    def _perspective(self, img: np.ndarray, labels: np.ndarray, geometry: Any,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, Any]:
        """The random perspective of a letterboxed sample, applied to its image, boxes and geometry."""
        return *A.random_perspective(img, labels, rng, self.hyp), None

    def _compose(self, key: int | SampleKey) -> ComposedSample:
        """Sample ``key``'s image and pixel xyxy labels with their geometry (a subclass's polygons or keypoints,
        through the four hooks above), before the colour and flip augmentations every task shares: a mosaic (and
        mixup) with probability ``hyp.mosaic`` when mosaic is on, else the letterboxed image (randomly warped when
        augmenting). The generator's draws come in the reference's order, which the parity tests hold."""
        index, epoch, mosaic = key if isinstance(key, tuple) else (key, self.epoch, self.mosaic)
        index = int(index)
        rng = np.random.default_rng([self.seed, int(epoch), index])
        if mosaic and rng.random() < self.hyp.mosaic:
            img, labels, geometry = self._mosaic(index, rng)
            if rng.random() < self.hyp.mixup:
                img2, labels2, geometry2 = self._mosaic(int(rng.integers(len(self))), rng)
                img, labels = A.mixup(img, labels, img2, labels2, rng)
                geometry = self._joined(geometry, geometry2)
            return ComposedSample(index, img, labels, geometry, rng, None)
        img = self.load_image(index)
        h, w = img.shape[:2]
        img, r, pad = A.letterbox(img, self.output_shape(index), scaleup=self.augment)
        size = (round(w * r), round(h * r))
        labels = A.xywhn_to_xyxy(self.labels[index], *size, *pad)
        geometry = self._placed(index, size, pad)
        if self.augment:
            img, labels, geometry = self._perspective(img, labels, geometry, rng)
        return ComposedSample(index, img, labels, geometry, rng, ((h, w), pad))

    def __getitem__(self, key: int | SampleKey) -> tuple[np.ndarray, np.ndarray]:
        _, img, labels, _, rng, _ = self._compose(key)
        labels = A.xyxy_to_xywhn(labels, img.shape[1], img.shape[0])
        if self.augment:
            img = A.hsv_to_rgb(img, rng, self.hyp.hsv_h, self.hyp.hsv_s, self.hyp.hsv_v)
            img, labels = A.random_flips(img, labels, rng, self.hyp.flipud, self.hyp.fliplr)
        else:
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        return img, labels

    def __getitems__(self, keys: Sequence[int | SampleKey]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The samples of a loader's batch (the DataLoader's batched fetch), built on :attr:`threads` threads in a
        process without loader workers."""
        return map_samples(self.__getitem__, keys, self.threads)

    @staticmethod
    def collate(batch: Sequence[tuple[np.ndarray, np.ndarray]], uint8: bool = False,
                buffers: BatchBuffers | None = None) -> Batch:
        """Stack items into a :class:`Batch` of ``imgs`` float32 ``[B,3,H,W]`` in 0..1 and ``targets`` ``[N, 6]`` =
        (image index, class, cx, cy, w, h).

        ``uint8``: ``imgs`` as uint8 0..255 instead, what loader workers send (a quarter of the bytes
        through shared memory); :func:`float_images` turns them to float32 in the main process.
        ``buffers``: in the main process, float batches go into its reused (or pinned) memory, filled on its threads.
        """
        h, w = batch[0][0].shape[:2]
        shape = (len(batch), 3, h, w)
        dtype = torch.uint8 if uint8 else torch.float32
        if get_worker_info() is None and not uint8:
            imgs = buffers.take(shape) if buffers is not None else torch.empty(shape, dtype=dtype)
        else:
            # A worker's batch reaches the main process through shared memory; allocating it there
            # directly (as torch's default_collate does) saves a copy of the whole batch.
            storage = torch.UntypedStorage._new_shared(int(np.prod(shape)) * dtype.itemsize)
            imgs = torch.empty(0, dtype=dtype).set_(storage, 0, shape)
        planes = imgs.numpy()
        if uint8:
            for i, (img, _) in enumerate(batch):
                # Written in place when the planes fit (contiguous, the right size), else copied in.
                for plane, written in zip(planes[i], cv2.split(img, list(planes[i]))):
                    if written is not plane:
                        plane[...] = written
        else:
            threads = buffers.threads if buffers is not None else 1
            map_samples(lambda i: _scale_into(batch[i][0], planes[i]), range(len(batch)), threads)
        counts = [len(b[1]) for b in batch]
        targets = torch.zeros((sum(counts), 6), dtype=torch.float32)
        # Filled through numpy: torch's repeat_interleave wakes its thread pool for a few hundred numbers,
        # which costs milliseconds per batch on a busy machine.
        rows = targets.numpy()
        rows[:, 0] = np.repeat(np.arange(len(batch), dtype=np.float32), counts)
        if len(rows):
            rows[:, 1:] = np.concatenate([b[1] for b in batch])
        return Batch(imgs, targets)


_SPLIT_PLANES = threading.local()


def _scale_into(img: np.ndarray, out: np.ndarray) -> None:
    """HWC uint8 ``img`` as CHW float32 0..1 in ``out``: split into uint8 planes (in a buffer this thread reuses: fresh
    memory per image costs more in page faults than the conversion), then scaled reading contiguous memory, a quarter
    faster than scaling the strided HWC view and several times faster than converting a permuted uint8 tensor."""
    size = int(np.prod(out.shape))
    buffer = getattr(_SPLIT_PLANES, "buffer", None)
    if buffer is None or buffer.size < size:  # rectangular batches differ in shape: the largest so far is kept
        buffer = _SPLIT_PLANES.buffer = np.empty(size, np.uint8)
    split = buffer[:size].reshape(out.shape)
    for plane, written in zip(split, cv2.split(img, list(split))):
        if written is not plane:
            plane[...] = written
    np.multiply(split, np.float32(1 / 255), out=out, casting="unsafe")


def float_images(imgs: torch.Tensor, buffers: BatchBuffers) -> torch.Tensor:
    """uint8 ``[B,3,H,W]`` images (as :meth:`DetectionDataset.collate` with ``uint8``) as float32 in 0..1,
    in memory of ``buffers`` (pinned with CUDA)."""
    out = buffers.take(tuple(imgs.shape))
    np.multiply(imgs.numpy(), np.float32(1 / 255), out=out.numpy(), casting="unsafe")
    return out


class BatchBuffers:
    """Float batch memory of one loader in the main process, reused once nothing refers to a batch any more.

    A fresh 16 x 3 x 640 x 640 float batch costs more in page faults than in filling it. Each buffer is a
    numpy array lent as a tensor through ``torch.frombuffer``, whose storage holds a reference to the
    array for as long as any tensor or view of the batch lives: an array referred to only by this pool
    is free. Two buffers cover a batch in use and the next one; a batch kept longer gets memory of its
    own. With CUDA, batches go to pinned memory instead (torch keeps freed pinned blocks), so the
    loader's pinning step has nothing left to copy.
    """

    MAX_BUFFERS = 2

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads  # that fill a batch (see sample_threads)
        self._arrays: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        if torch.cuda.is_available():
            return torch.empty(shape, dtype=torch.float32, pin_memory=True)
        count = int(np.prod(shape))
        with self._lock:
            free = [i for i in range(len(self._arrays)) if sys.getrefcount(self._arrays[i]) <= _POOL_ONLY_REFS]
            array = next((self._arrays[i] for i in free if self._arrays[i].size >= count), None)
            if array is None:
                array = np.empty(count, np.float32)
                if len(self._arrays) < self.MAX_BUFFERS:
                    self._arrays.append(array)
                elif free:
                    self._arrays[free[0]] = array
            return torch.frombuffer(array, dtype=torch.float32, count=count).view(shape)


# References to a pooled array when no batch uses it: the pool's list and getrefcount's argument.
_POOL_ONLY_REFS = 2


def loaded_size(size_wh: np.ndarray, img_size: int) -> np.ndarray:
    """(w, h) of images of ``size_wh`` once loaded: the long side scaled to ``img_size``, sides rounded up
    (the reference's rule; validation maps boxes back through it)."""
    size = np.asarray(size_wh, dtype=np.float64)
    return np.ceil(size * (img_size / size.max(-1, keepdims=True)))


def rect_batch_shapes(
    shapes: np.ndarray, batch_size: int, img_size: int, stride: int, pad: float
) -> np.ndarray:
    """Per-batch (h, w) for images sorted by aspect ratio: the batch's extreme aspect ratio fitted in
    ``img_size``, rounded up to ``stride`` by the reference's rule
    ``ceil(s * img_size / stride + pad) * stride``."""
    ar = shapes[:, 1] / shapes[:, 0]  # h / w
    starts = np.arange(0, len(ar), batch_size)
    mini, maxi = np.minimum.reduceat(ar, starts), np.maximum.reduceat(ar, starts)
    rel = np.ones((len(starts), 2))
    rel[maxi < 1, 0] = maxi[maxi < 1]  # all wide: height shrinks
    tall = mini > 1
    rel[tall, 1] = 1 / mini[tall]  # all tall: width shrinks
    return np.ceil(rel * img_size / stride + pad).astype(int) * stride
