"""Classification data: ImageNet-style folders (``train/<class>/*.jpg``, ``val/<class>/*.jpg`` or
``test/<class>/*.jpg``), verified, optionally cached, with the reference's transforms.

Class names are the class folder names, sorted (as torchvision's ``ImageFolder`` names them); a class is
the index of its name. Images are verified by decoding them (the detection verifier's check) once per version
of the split: the result is cached beside the split folder (``<root>/<split>.yolotrain.cache``; under the user
cache folder for a read-only dataset), keyed by every image's path and version, so an image added, removed or
changed checks the split again. An unreadable image is named in one counted
:class:`~yolotrain.data.verify.DataWarning` on every run and skipped.

Transforms (the reference's ``utils/augmentations.py``): evaluation takes the centred square of the short
side resized to ``img_size`` (``classify_transforms``); training a random resized crop (scale 0.08-1, aspect
3/4-4/3), a horizontal flip and brightness/contrast/saturation jitter (``classify_albumentations``), drawn
from (seed, epoch, index) so a run's samples do not depend on the number of loader processes. Both end in
RGB float tensors normalised with the ImageNet mean and standard deviation.
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Literal

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.v2 import functional as tvf

from ..atomic import write_atomic
from ..settings import setting
from .batch import Batch
from .cachedir import cache_root, file_signature
from .dataset import ImageReadError, SampleKey
from .imagecache import disk_cache
from .loaders import EpochBatchSampler, default_workers
from .sample_threads import default_sample_threads, map_samples
from .shapes import CLASS_NAMES as SHAPE_NAMES
from .shapes import draw_sample
from .sources import IMG_FORMATS
from .verify import CacheWarning, DataWarning, _writable, check_image, max_image_pixels
from .walk import FolderWalkWarning, walk_folders

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# As float32 per channel of a [B, 3, H, W] batch: the values the reference's Normalize subtracts and divides by.
_MEAN = np.array(IMAGENET_MEAN, np.float32)[:, None, None]
_STD = np.array(IMAGENET_STD, np.float32)[:, None, None]
TRAIN_SPLIT = "train"
# The split evaluated: ``test`` when the dataset has one, else ``val`` (the reference's classify/val.py).
EVAL_SPLITS = ("test", "val")
# Tries of the random resized crop before it falls back to the centre crop (torchvision's rule).
CROP_TRIES = 10
# Bump when what the verification cache records changes, so older caches are not read.
CACHE_VERSION = 1
# Files named per kind of problem in the verification warning.
SHOWN_PROBLEMS = 3

Sample = tuple[Path, int]


@dataclass(frozen=True)
class ClassifyAugment:
    """The reference's classification augmentations (``classify_albumentations`` defaults)."""

    scale_min: float = setting(0.08, "smallest share of the image area a training crop covers", min=0.001, max=1)
    ratio_min: float = setting(0.75, "narrowest aspect ratio (w/h) of a training crop (the widest is its inverse)",
                               above=0, max=1)
    fliplr: float = setting(0.5, "probability of a left-right flip", min=0, max=1)
    flipud: float = setting(0.0, "probability of an up-down flip", min=0, max=1)
    jitter: float = setting(0.4, "brightness, contrast and saturation jitter (factors 1 ± jitter)", min=0, max=1)


@dataclass
class ClassifySource:
    """A classification dataset on disk: its split folders, class names and the ``(image, class)`` samples of
    the splits listed."""

    root: Path
    names: list[str]
    folders: list[str]
    splits: dict[str, list[Sample]] = field(default_factory=dict)

    @property
    def eval_split(self) -> str | None:
        """The split validation reads: ``test`` when present, else ``val`` (None without either)."""
        return next((s for s in EVAL_SPLITS if s in self.folders), None)


def class_folders(split: Path) -> list[str]:
    """Sorted names of the class folders of a split (hidden folders ignored)."""
    return sorted(entry.name for entry in os.scandir(split) if entry.is_dir() and not entry.name.startswith("."))


def split_samples(split: Path, names: Sequence[str]) -> list[Sample]:
    """Every image under each class folder of ``split`` (recursively, following links to folders; sorted), with
    its class index. Each image is listed once, under its real place when a link leads to it from elsewhere;
    links that loop or lead to a folder listed already are not followed, named in one
    :class:`~yolotrain.data.walk.FolderWalkWarning` (:func:`~yolotrain.data.walk.walk_folders`)."""
    index = {name: i for i, name in enumerate(names)}
    folders = class_folders(split)
    if not folders:
        raise ValueError(f"{split}: no class folders (expected {split.name}/<class name>/<image>)")
    for folder in folders:
        if folder not in index:
            raise ValueError(f"{split / folder}: class folder {folder!r} is not one of the {len(names)} classes "
                             f"({', '.join(names[:5])}{' ...' if len(names) > 5 else ''})")
    walk = walk_folders([split / folder for folder in folders], IMG_FORMATS, broken_links=True)
    repeats = walk.repeats(str(split), split)
    if repeats:
        warnings.warn(repeats, FolderWalkWarning, stacklevel=2)
    return [(path, index[folder]) for folder, found in zip(folders, walk.files) for path in found]


def empty_class_folders(split: Path, samples: Sequence[Sample], names: Sequence[str]) -> list[str]:
    """The class folders of ``split`` without an image (torchvision's ``ImageFolder`` refuses them: a class
    no image shows cannot be learnt, and would still take a share of every prediction)."""
    counts = np.bincount([label for _, label in samples], minlength=len(names))
    return [folder for folder in class_folders(split) if counts[names.index(folder)] == 0]


def detection_layout(path: str | os.PathLike) -> str | None:
    """What kind of detection dataset ``path`` is, when it is one rather than class folders ("a dataset YAML of a
    detection dataset", or a folder of ``images/``, or of splits holding ``images/`` and ``labels/``); else None."""
    p = Path(path).expanduser()
    if p.is_file() and p.suffix.lower() in (".yaml", ".yml"):
        return "a dataset YAML of a detection dataset"
    if p.is_dir() and ((p / "images").is_dir() or any(
            {"images", "labels"} <= set(class_folders(p / s)) for s in (TRAIN_SPLIT, *EVAL_SPLITS, "valid")
            if (p / s).is_dir())):
        return "a detection dataset (images/ and labels/ folders)"
    return None


def is_classify_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder of split folders holding class folders (``train/<class>/``, ``val/<class>/``)."""
    root = Path(path)
    splits = [root / s for s in (TRAIN_SPLIT, *EVAL_SPLITS) if (root / s).is_dir()]
    return bool(splits) and all(class_folders(s) for s in splits) and not (root / "images").is_dir()


def resolve_classify_source(path: str | os.PathLike, names: Sequence[str] | None = None,
                            splits: Sequence[str] = ("train", "val")) -> ClassifySource:
    """The class names of an ImageNet-style folder and the samples of ``splits`` (``val``: the ``test/`` folder
    when present, as the reference's ``classify/val.py`` reads it, else ``val/``).

    ``names`` fixes the classes (a model's, for validation); otherwise they are the folder names of ``train/``
    (else of the evaluated split). A class folder outside them is an error, so indices never shift silently.

    Raises:
        FileNotFoundError: no such folder, or a split asked for that it does not have.
        ValueError: a detection dataset (:func:`detection_layout`), one class only, a split without class
            folders, a class folder that is not one of the classes or a class folder without an image.
    """
    root = Path(path).expanduser()
    detection = detection_layout(root)
    if detection is not None:
        raise ValueError(f"{root} is {detection}: a classifier needs a folder of class folders "
                         "(train/<class>/<image>, val/<class>/<image>)")
    if not root.is_dir():
        raise FileNotFoundError(f"classification dataset folder not found: {root}")
    folders = [s for s in (TRAIN_SPLIT, *EVAL_SPLITS) if (root / s).is_dir()]
    if not folders:
        raise FileNotFoundError(f"{root}: no train/, val/ or test/ folder of class folders")
    source = ClassifySource(root, [], folders)
    source.names = [str(n) for n in names] if names is not None else class_folders(root / folders[0])
    if names is None and len(source.names) < 2:
        raise ValueError(f"{root / folders[0]}: one class folder ({', '.join(source.names)}): a classifier needs at "
                         "least 2 classes, a folder of images for each")
    for split in splits:
        folder = source.eval_split if split == "val" else split
        if folder is None or folder not in folders:
            raise FileNotFoundError(f"{root}: no {'val/ or test/' if split == 'val' else split + '/'} folder")
        source.splits[split] = split_samples(root / folder, source.names)
        empty = empty_class_folders(root / folder, source.splits[split], source.names)
        if empty:
            raise ValueError(f"{root / folder}: {len(empty)} class folder(s) without an image: {', '.join(empty)} "
                             "(every class needs images; remove the folder or add images)")
    return source


@dataclass
class SplitCheck:
    """What verifying a split's images found: the usable samples and, by kind of problem, the unusable
    images (all of them named)."""

    total: int
    kept: list[Sample]
    problems: dict[str, list[str]] = field(default_factory=dict)

    @property
    def corrupt(self) -> int:
        return self.total - len(self.kept)

    def summary(self, name: str = "") -> str:
        """One line of counts, then each kind of problem with a few of its images."""
        lines = [f"{name or 'dataset'}: {self.total} images, {self.corrupt} corrupt skipped"]
        for kind, paths in sorted(self.problems.items()):
            more = f" (+{len(paths) - SHOWN_PROBLEMS} more)" if len(paths) > SHOWN_PROBLEMS else ""
            lines.append(f"  {len(paths)} x {kind}: {'; '.join(paths[:SHOWN_PROBLEMS])}{more}")
        return "\n".join(lines)


def _fingerprint(samples: Sequence[Sample]) -> str:
    """Hash of the split's image list with each image's version (:func:`.cachedir.file_signature`) and the
    size limit verification applies: an image added, removed, renamed or rewritten changes it."""
    digest = hashlib.sha256(f"classify v{CACHE_VERSION} max={max_image_pixels()}\n".encode())
    for path, _ in samples:
        try:
            digest.update(f"{path}\0{file_signature(path)}\n".encode())
        except OSError:
            digest.update(f"{path}\0-\n".encode())
    return digest.hexdigest()


def split_cache_paths(split_dir: Path) -> tuple[Path, Path]:
    """The verification cache of a split folder (``<root>/<split>.yolotrain.cache``, beside it) and its fallback
    under the user cache folder for a read-only dataset (where detection keeps its label caches)."""
    key = hashlib.sha1(str(split_dir.resolve()).encode()).hexdigest()[:16]
    return (split_dir.with_name(f"{split_dir.name}.yolotrain.cache"),
            cache_root() / "labels" / f"classify-{split_dir.name}-{key}.cache")


def _save_check(path: Path, samples: Sequence[Sample], problems: Sequence[str], fingerprint: str) -> None:
    def write(temp: Path) -> None:
        with temp.open("wb") as f:
            np.savez(f, version=np.array(CACHE_VERSION), fingerprint=np.array(fingerprint),
                     files=np.array([str(p) for p, _ in samples], dtype=str), problems=np.array(problems, dtype=str))

    write_atomic(path, write, durable=False)  # a lost cache only costs a re-check


def _load_check(path: Path, samples: Sequence[Sample], fingerprint: str) -> list[str] | None:
    """Each sample's problem ("" for a usable image) as cached at ``path``, when the cache is of these images
    as they are now; a cache whose content disagrees with its fingerprint gets a :class:`CacheWarning`."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if int(z["version"]) != CACHE_VERSION or str(z["fingerprint"]) != fingerprint:
                return None
            files, problems = z["files"], z["problems"]
    except (OSError, ValueError, KeyError):
        return None
    if files.shape != (len(samples),) or problems.shape != files.shape or files.tolist() != [
            str(p) for p, _ in samples]:
        warnings.warn(f"{path}: cached verification not trusted (files that are not the split's); checking the "
                      "images again", CacheWarning, stacklevel=4)
        return None
    return [str(p) for p in problems.tolist()]


def _decode_problems(samples: Sequence[Sample], workers: int | None) -> list[str]:
    """Each sample's problem ("" for an image that decodes), from decoding every image (threads: decoding
    releases the GIL)."""
    with ThreadPool(workers or min(8, os.cpu_count() or 1)) as pool:
        checked = pool.map(check_image, [path for path, _ in samples], chunksize=8)
    return ["" if shape is not None else problem or "unreadable" for shape, problem in checked]


def check_split(samples: Sequence[Sample], split_dir: str | os.PathLike, workers: int | None = None) -> SplitCheck:
    """Which images of a split (the samples of ``split_dir``) decode, from the split's verification cache when
    it is current, else by decoding them all and caching the result (beside the split folder, or under the
    user cache folder when the dataset is read-only)."""
    split_dir = Path(split_dir)
    fingerprint = _fingerprint(samples)
    primary, fallback = split_cache_paths(split_dir)
    problems = _load_check(primary, samples, fingerprint)
    if problems is None:
        problems = _load_check(fallback, samples, fingerprint)
    if problems is None:
        problems = _decode_problems(samples, workers)
        for target in (primary, fallback) if _writable(split_dir.parent) else (fallback,):
            try:
                _save_check(target, samples, problems, fingerprint)
                break
            except OSError:
                continue  # unwritable: try the user cache folder; failing both only costs time next run
    named: dict[str, list[str]] = defaultdict(list)
    for (path, _), problem in zip(samples, problems):
        if problem:
            named[problem].append(str(path))
    return SplitCheck(len(samples), [s for s, problem in zip(samples, problems) if not problem], dict(named))


def verify_samples(samples: Sequence[Sample], split_dir: str | os.PathLike, name: str = "",
                   workers: int | None = None) -> list[Sample]:
    """The samples of ``split_dir`` whose image decodes (:func:`check_split`); the others are named in one
    counted :class:`DataWarning`, on every run.

    Raises:
        ValueError: no usable image is left.
    """
    checked = check_split(samples, split_dir, workers)
    if checked.problems:
        warnings.warn(checked.summary(name), DataWarning, stacklevel=2)
    if not checked.kept:
        raise ValueError(f"{name or 'dataset'}: no usable images left after verification")
    return checked.kept


def centre_crop(im: np.ndarray, size: int) -> np.ndarray:
    """The centred square of the short side, resized to ``size`` (the reference's ``CenterCrop``)."""
    h, w = im.shape[:2]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    return cv2.resize(im[top:top + side, left:left + side], (size, size), interpolation=cv2.INTER_LINEAR)


def random_resized_crop(im: np.ndarray, size: int, rng: np.random.Generator, scale: tuple[float, float],
                        ratio: tuple[float, float]) -> np.ndarray:
    """A crop of random area share and aspect ratio resized to ``size`` (torchvision's ``RandomResizedCrop``
    rule: ``CROP_TRIES`` draws, then the centre crop at the nearest allowed ratio)."""
    h, w = im.shape[:2]
    area = h * w
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(CROP_TRIES):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            break
    else:
        in_ratio = w / h
        cw, ch = (w, round(w / ratio[0])) if in_ratio < ratio[0] else (
            (round(h * ratio[1]), h) if in_ratio > ratio[1] else (w, h))
        top, left = (h - ch) // 2, (w - cw) // 2
    return cv2.resize(im[top:top + ch, left:left + cw], (size, size), interpolation=cv2.INTER_LINEAR)


def colour_jitter(rgb: torch.Tensor, jitter: float, rng: np.random.Generator) -> torch.Tensor:
    """Brightness, contrast and saturation scaled by factors in ``1 ± jitter``, applied in random order."""
    adjust = (tvf.adjust_brightness, tvf.adjust_contrast, tvf.adjust_saturation)
    factors = rng.uniform(max(0.0, 1 - jitter), 1 + jitter, size=3)
    for i in rng.permutation(3):
        rgb = adjust[i](rgb, float(factors[i]))
    return rgb


def normalise_batch(bgr: np.ndarray) -> torch.Tensor:
    """BGR uint8 images ``[B, H, W, 3]`` → RGB float32 ``[B, 3, H, W]``, normalised with the ImageNet mean and
    standard deviation: ``(x / 255 - mean) / std`` in float32, element for element what the reference's
    ``ToTensor`` and ``Normalize`` give each image. Three numpy passes over the batch, on this thread: per
    image, torch's parallel element-wise kernels cost more in starting their threads than in the arithmetic."""
    out = np.empty((bgr.shape[0], 3, *bgr.shape[1:3]), np.float32)
    np.divide(bgr[..., ::-1].transpose(0, 3, 1, 2), np.float32(255), out=out)
    np.subtract(out, _MEAN, out=out)
    np.divide(out, _STD, out=out)
    return torch.from_numpy(out)


def to_normalised_tensor(bgr: np.ndarray) -> torch.Tensor:
    """HWC BGR uint8 → CHW RGB float32, normalised with the ImageNet mean and standard deviation."""
    return normalise_batch(bgr[None])[0]


def eval_transform(bgr: np.ndarray, size: int) -> torch.Tensor:
    """The reference's evaluation transform: centre crop, RGB, ImageNet normalisation."""
    return to_normalised_tensor(centre_crop(bgr, size))


def train_transform(bgr: np.ndarray, size: int, augment: ClassifyAugment, rng: np.random.Generator) -> torch.Tensor:
    """The reference's training transform: random resized crop, flips, colour jitter, ImageNet normalisation."""
    return to_normalised_tensor(train_crop(bgr, size, augment, rng))


def train_crop(bgr: np.ndarray, size: int, augment: ClassifyAugment, rng: np.random.Generator) -> np.ndarray:
    """:func:`train_transform` before the normalisation: the augmented crop, HWC BGR uint8."""
    im = random_resized_crop(bgr, size, rng, (augment.scale_min, 1.0), (augment.ratio_min, 1 / augment.ratio_min))
    if rng.random() < augment.fliplr:
        im = im[:, ::-1]
    if rng.random() < augment.flipud:
        im = im[::-1]
    if augment.jitter > 0:
        rgb = colour_jitter(torch.from_numpy(np.ascontiguousarray(im[..., ::-1].transpose(2, 0, 1))), augment.jitter,
                            rng)
        im = rgb.numpy().transpose(1, 2, 0)[..., ::-1]
    return im


class ClassifyDataset(Dataset):
    """``(image [3, S, S] float32 normalised, class index)`` items of one split.

    ``cache``: ``ram`` keeps each decoded image after its first read (per loader process), ``disk`` decodes
    every image once into a ``.npy`` beside it (see :mod:`.imagecache`). Items are keyed by
    ``(index, epoch, _)`` (:class:`~yolotrain.data.loaders.EpochBatchSampler`) or a plain index. ``threads``
    build a batch's crops in a process without loader workers (see :mod:`.sample_threads`).
    """

    rect = False
    mosaic = False

    def __init__(self, samples: Sequence[Sample], img_size: int = 224, augment: ClassifyAugment | None = None,
                 seed: int = 0, cache: Literal["ram", "disk", "off"] = "off", names: Sequence[str] = (),
                 threads: int = 1) -> None:
        self.samples = list(samples)
        self.threads = max(1, int(threads))
        self.files = [path for path, _ in self.samples]
        self.labels = np.array([label for _, label in self.samples], dtype=np.int64)
        self.img_size = int(img_size)
        self.augment = augment
        self.seed = int(seed)
        self.epoch = 0
        self.names = list(names)
        self.cache = cache
        self._ram: dict[int, np.ndarray] = {}
        self._arrays = disk_cache(self.files) if cache == "disk" else None

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def im_files(self) -> list[Path]:
        """The image files in sample order (the detection datasets' name for them)."""
        return self.files

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def load_image(self, index: int) -> np.ndarray:
        """The decoded HWC BGR image of sample ``index``."""
        if index in self._ram:
            return self._ram[index]
        if self._arrays is not None:
            im = np.load(self._arrays[index])
        else:
            im = cv2.imread(str(self.files[index]), cv2.IMREAD_COLOR)
            if im is None:
                raise ImageReadError(f"cannot read image {self.files[index]}")
        if self.cache == "ram":
            self._ram[index] = im
        return im

    def crop(self, key: int | SampleKey) -> tuple[np.ndarray, int]:
        """The transformed image of a sample before its normalisation (HWC BGR uint8 ``[S, S, 3]``: the centre
        crop, or the augmented one when training) and its class."""
        index, epoch = (key[0], key[1]) if isinstance(key, tuple) else (int(key), self.epoch)
        im = self.load_image(index)
        if self.augment is None:
            return centre_crop(im, self.img_size), int(self.labels[index])
        rng = np.random.default_rng([self.seed, epoch, index])
        return train_crop(im, self.img_size, self.augment, rng), int(self.labels[index])

    def __getitem__(self, key: int | SampleKey) -> tuple[torch.Tensor, int]:
        im, label = self.crop(key)
        return to_normalised_tensor(im), label

    def __getitems__(self, keys: Sequence[int | SampleKey]) -> SampleBatch:
        """The samples of a loader's batch (the DataLoader's batched fetch), their crops normalised together."""
        crops = np.empty((len(keys), self.img_size, self.img_size, 3), np.uint8)
        labels = np.empty(len(keys), np.int64)

        def crop_into(i: int) -> None:
            crops[i], labels[i] = self.crop(keys[i])

        map_samples(crop_into, range(len(keys)), self.threads)
        return SampleBatch(normalise_batch(crops), torch.from_numpy(labels))

    @staticmethod
    def collate(batch: list[tuple[torch.Tensor, int]]) -> Batch:
        """A :class:`Batch` of images ``[B, 3, S, S]`` and classes ``[B]``; a :class:`SampleBatch` is taken as it
        is, without a copy."""
        if isinstance(batch, SampleBatch):
            return Batch(batch.images, batch.labels)
        imgs, labels = zip(*batch)
        return Batch(torch.stack(imgs), torch.tensor(labels, dtype=torch.int64))


class SampleBatch(list):
    """The samples of one batch, ``(image, class)`` pairs as ``dataset[i]`` gives each, made together: each image
    is a row of ``images`` ``[B, 3, S, S]``, so a collate that knows this class hands the batch on without
    stacking copies of its rows (any other collate sees a plain list of samples)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().__init__(zip(images, labels.tolist()))
        self.images, self.labels = images, labels


@dataclass(frozen=True)
class SampleIndex:
    """The verified samples of a split in the form a checkpoint's dataset record hashes
    (:func:`~yolotrain.data.fingerprint.labels_digest`): files, each one's class as a label row, no sizes."""

    files: list[Path]
    labels: list[np.ndarray]
    shapes: np.ndarray

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> SampleIndex:
        return cls([path for path, _ in samples], [np.array([label], dtype=np.float32) for _, label in samples],
                   np.zeros((len(samples), 2), dtype=np.int64))


@dataclass
class ClassifyLoaders:
    """What :func:`build_classify_loaders` made: class names, the dataset root, the loaders of the splits asked
    for (``val`` reads ``test/`` when present) and their verified samples."""

    names: list[str]
    root: Path
    train: DataLoader | None = None
    val: DataLoader | None = None
    train_samples: list[Sample] = field(default_factory=list)
    val_samples: list[Sample] = field(default_factory=list)


def classify_loader(dataset: ClassifyDataset, batch_size: int, shuffle: bool, workers: int, seed: int = 0,
                    rank: int = 0, world_size: int = 1) -> DataLoader:
    """A DataLoader over ``dataset`` with the detection loaders' seeded, rank-shared batches."""
    return DataLoader(dataset, batch_sampler=EpochBatchSampler(dataset, batch_size, shuffle, seed, rank, world_size),
                      num_workers=workers, collate_fn=ClassifyDataset.collate, pin_memory=torch.cuda.is_available(),
                      persistent_workers=workers > 0)


def build_classify_loaders(path: str | os.PathLike, img_size: int = 224, batch_size: int = 64, *,
                           splits: Sequence[str] = ("train", "val"), augment: ClassifyAugment | None = None,
                           names: Sequence[str] | None = None, workers: int | None = None,
                           cache: Literal["ram", "disk", "off"] = "off", seed: int = 0, rank: int = 0,
                           world_size: int = 1) -> ClassifyLoaders:
    """Verify an ImageNet-style folder and build the loaders of ``splits`` (``train``: shuffled, augmented with
    ``augment`` (the reference's when None); ``val``: the ``test/`` split when present, else ``val/``, in file
    order, centre crops). ``batch_size`` is the global batch (each of ``world_size`` processes takes its share).

    Raises:
        FileNotFoundError, ValueError: as :func:`resolve_classify_source`, a split asked for that is missing,
            or a split without a usable image.
    """
    if img_size < 1 or batch_size < 1:
        raise ValueError(f"img_size and batch_size must be at least 1, got {img_size} and {batch_size}")
    source = resolve_classify_source(path, names, splits)
    workers = default_workers() if workers is None else workers
    threads = default_sample_threads(workers, world_size)
    loaders = ClassifyLoaders(source.names, source.root)
    if "train" in splits:
        loaders.train_samples = verify_samples(source.splits["train"], source.root / TRAIN_SPLIT, "train")
        train_set = ClassifyDataset(loaders.train_samples, img_size, augment or ClassifyAugment(), seed, cache,
                                    source.names, threads)
        loaders.train = classify_loader(train_set, batch_size, True, workers, seed, rank, world_size)
    if "val" in splits:
        loaders.val_samples = verify_samples(source.splits["val"], source.root / source.eval_split,
                                             source.eval_split)
        val_set = ClassifyDataset(loaders.val_samples, img_size, None, seed, cache, source.names, threads)
        loaders.val = classify_loader(val_set, batch_size, False, workers, seed)
    return loaders


def write_shape_crops(root: str | os.PathLike, n_train: int = 16, n_val: int = 8, img_size: int = 96,
                      seed: int = 0) -> Path:
    """A small classification dataset in ``root``: the objects of built-in shapes images (see :mod:`.shapes`)
    cut out into ``train/<circle|rectangle>/`` and ``val/…`` (``n_train``/``n_val`` source images per split,
    each giving one crop per object). Deterministic for equal arguments; returns ``root``."""
    root = Path(root)
    for split_id, (split, count) in enumerate((("train", n_train), ("val", n_val))):
        for name in SHAPE_NAMES:
            (root / split / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            im, labels = draw_sample(np.random.default_rng([seed, split_id, i]), img_size)
            for j, (cls, cx, cy, w, h) in enumerate(labels):
                x1, y1 = max(0, int((cx - w / 2) * img_size)), max(0, int((cy - h / 2) * img_size))
                x2, y2 = int(math.ceil((cx + w / 2) * img_size)), int(math.ceil((cy + h / 2) * img_size))
                cv2.imwrite(str(root / split / SHAPE_NAMES[int(cls)] / f"{i:04d}_{j}.png"), im[y1:y2, x1:x2])
    return root
