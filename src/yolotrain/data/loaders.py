"""The one path from a dataset on disk to DataLoaders: :func:`build_loaders`, used by training,
:func:`get_loaders`, validation and ``yolotrain data check`` alike."""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler

from ..boxes import check_image_size
from ..settings import setting
from .augment import AugmentConfig
from .batch import Batch
from .dataset import BatchBuffers, DetectionDataset, SampleKey, float_images
from .gpu_augment import DeviceAugmenter, DeviceAugmentLoader, EncodedDetectionDataset, augment_device
from .obb import OBBDataset
from .pose import PoseDataset
from .sample_threads import default_sample_threads
from .segment import SegmentationDataset
from .shapes import generate_shapes_dataset
from .sources import DatasetSource, resolve_source
from .verify import DataWarning, LabelIndex, verify_split

# The reference pads rectangular val batches by half a stride; training batches get none.
VAL_RECT_PAD = 0.5
REDUCED_DECODE_HELP = ("decode JPEGs at least twice the size they are used at by 1/2, 1/4 or 1/8 (libjpeg's DCT "
                       "scaling, the most that keeps them at or above that size), then resize: faster on large "
                       "photos; --no-reduced-decode: every image decoded at full size, the reference's pixels")
# With no class names known (``data check`` of a bare folder), only the label syntax is checked.
UNBOUNDED_CLASSES = 1 << 20


@dataclass(frozen=True)
class DataConfig:
    """Which data a run reads and how it is batched. ``None``: picked from the data (see TrainConfig)."""

    path: str | None = setting(None, "dataset YAML or folder (none: the built-in shapes dataset)",
                               flags=("--data",), aliases=("data",))
    img_size: int | None = setting(None, "network input size in pixels, a multiple of 32 (640; 160 on shapes)",
                                   flags=("--img", "--img-size", "--imgsz"), min=32, multiple_of=32)
    batch_size: int | None = setting(None, "global batch, all processes together (16; -1 or a fraction: AutoBatch)",
                                     flags=("--batch", "--batch-size"), min=1)
    autobatch: float = setting(0.0, "AutoBatch: the largest batch that fits this fraction of the GPU's free memory, "
                               "in place of batch (0: off; --batch -1 is 0.8, --batch 0.7 is 0.7)", min=0, max=1)
    workers: int | None = setting(None, "loader processes per training process (min(2, CPUs))", min=0)
    loader_threads: int = setting(
        0, "threads that build a batch's samples with --workers 0, in the training process (0: its share of the "
        "CPUs, at most 8); the batches are the same for any number", min=0)
    rect: bool = setting(False, "rectangular training batches in aspect order (no mosaic)")
    cache_mb: float = setting(512.0, "per-process memory budget (MiB) for decoded images; 0 turns it off", min=0)
    cache: Literal["ram", "disk", "off"] = setting(
        "off", "keep decoded images: ram (all, before training), disk (.npy beside the images, or under the "
        "cache folder when read-only), off (only the memory budget above)", const="ram")
    reduced_decode: bool = setting(True, REDUCED_DECODE_HELP)
    single_cls: bool = setting(False, "train and validate as one class ('item' unless the data has one name)")
    multi_scale: bool = setting(False, "each training batch resized to a random 0.5-1.5x image size (multiple of 32)")
    image_weights: bool = setting(False, "each epoch, draw the training images (with replacement) by the weights of "
                                  "their classes: rare classes and classes of low validation mAP more often")
    quad: bool = setting(False, "training batches of a quarter as many images at twice the size: each one a 2x2 "
                         "tile of four loaded images or one of them upsampled 2x (the reference's quad loader)")
    overlap_mask: bool = setting(True, "segmentation: one map of numbered masks per image (smaller objects on top) "
                                 "rather than one mask per object", off_flags=("--no-overlap",))
    mask_ratio: int = setting(4, "segmentation: target masks at 1/N of the image size (4: the prototypes' size)",
                              min=1, max=32)
    augment_device: Literal["loader", "cuda", "cpu"] = setting(
        "loader", "where training images are decoded and augmented: loader (its processes, OpenCV), cuda (nvJPEG "
        "and batched tensor operations on the GPU; the loader processes only read files), cpu (that tensor path "
        "on the CPU); the tensor path augments boxes only: no segmentation, --rect or --cache")


def default_workers() -> int:
    """Loader processes when none are asked for: two, or one on a single-core machine."""
    return min(2, os.cpu_count() or 1)


@dataclass
class Loaders:
    """What :func:`build_loaders` made: loaders of the requested splits, their verified indexes, the
    class names and the dataset's root (the generated shapes folder when the config names no data)."""

    names: list[str]
    root: str
    train: DataLoader | None = None
    val: DataLoader | None = None
    train_index: LabelIndex | None = None
    val_index: LabelIndex | None = None


def build_loaders(
    config: DataConfig,
    augment: AugmentConfig | None = None,
    *,
    num_classes: int | None = None,
    splits: Sequence[str] = ("train", "val"),
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    val_rect: bool = True,
    stride: int = 32,
    require_names: bool = False,
    kind: str = "boxes",
) -> Loaders:
    """Verify the dataset of ``config`` and build the DataLoaders of ``splits``.

    The train loader shuffles and, with ``augment``, augments (mosaic unless ``config.rect``); the
    val loader never augments and walks the split in the reference's aspect order, in rectangular
    batches padded by half a stride (``val_rect``) or square letterboxes. Large JPEGs are decoded
    reduced unless ``config.reduced_decode`` is off (see :func:`~yolotrain.data.dataset.decode_flag`).
    ``batch_size`` is the global batch: with ``world_size > 1`` each process takes its share of the
    training batches; validation is whole on every process that asks for it.

    Args:
        num_classes: class ids must be below this; default: the number of class names in the data
            (only the label syntax is checked when it has none).
        require_names: refuse a dataset without class names (a model cannot be sized for it).
        kind: what the labels are read as (a task's :data:`DATASET_KINDS` name): ``boxes``; ``masks``, segmentation
            datasets (:class:`~yolotrain.data.segment.SegmentationDataset`: batches with target masks per
            ``config.overlap_mask`` and ``config.mask_ratio``; a split without any polygon label is refused in one
            line); ``keypoints``, pose datasets (:class:`~yolotrain.data.pose.PoseDataset`: rows of the YAML's
            ``kpt_shape``); ``rotated``, oriented boxes (:class:`~yolotrain.data.obb.OBBDataset`).
    """
    if kind not in DATASET_KINDS:
        raise ValueError(f"kind must be one of {', '.join(DATASET_KINDS)}, got {kind!r}")
    img_size = check_image_size(config.img_size or 0, stride)
    batch_size = config.batch_size or 0
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {config.batch_size}")
    root = config.path
    if root is None:
        root = str(generate_shapes_dataset())
    source = resolve_source(root)
    names = list(source.names)
    if require_names and not names:
        raise ValueError(f"{root}: the dataset defines no class names")
    nc = num_classes or len(names) or UNBOUNDED_CLASSES
    workers = default_workers() if config.workers is None else config.workers
    threads = config.loader_threads or default_sample_threads(workers, world_size)
    names = run_class_names(names, config)
    loaders = Loaders(names, str(root))
    if "train" in splits:
        if config.image_weights and config.rect:
            # The reference turns --rect off under --image-weights; a silent change of batches is refused here.
            raise ValueError("image_weights draws training images by class, which rect's aspect-ordered batches "
                             "cannot keep; give one of them")
        if config.quad and kind != "boxes":
            raise ValueError(f"quad merges detection batches; batches with {kind} are not merged, train without quad")
        on_device = augment is not None and config.augment_device != "loader"
        device = augment_device(config.augment_device, rect=config.rect, cache=config.cache,
                                boxes_only=kind == "boxes") if on_device else None
        loaders.train_index = verify_split(source.train, nc, "train", **_label_arguments(kind, source))
        dataset, extra = DATASET_KINDS[kind](loaders.train_index, config, source, "train")
        if device is not None:
            dataset = EncodedDetectionDataset
        train_set = dataset(_classes(loaders.train_index, config), img_size, batch_size,
                            augment=augment is not None, hyp=augment, rect=config.rect, pad=0.0,
                            stride=stride, seed=seed, names=names, cache_mb=config.cache_mb,
                            cache=config.cache, reduced_decode=config.reduced_decode, threads=threads, **extra)
        loaders.train = make_loader(train_set, batch_size, True, workers, seed, rank, world_size)
        if device is not None:
            loaders.train = DeviceAugmentLoader(loaders.train, DeviceAugmenter(train_set.hyp, img_size, device))
        if config.quad:
            loaders.train = QuadLoader(loaders.train, seed, rank)
    if "val" in splits:
        same = source.val == source.train and loaders.train_index is not None
        loaders.val_index = (loaders.train_index if same
                             else verify_split(source.val, nc, "val", **_label_arguments(kind, source)))
        index = reference_rect_order(loaders.val_index) if val_rect else loaders.val_index
        dataset, extra = DATASET_KINDS[kind](index, config, source, "val")
        val_set = dataset(_classes(index, config), img_size, batch_size, augment=False, rect=val_rect,
                          pad=VAL_RECT_PAD if val_rect else 0.0, stride=stride, seed=seed, names=names,
                          cache_mb=config.cache_mb, cache=config.cache, reduced_decode=config.reduced_decode,
                          threads=threads, **extra)
        loaders.val = make_loader(val_set, batch_size, False, workers, seed)
    return loaders


def _label_arguments(kind: str, source: DatasetSource) -> dict[str, Any]:
    """How :func:`~yolotrain.data.verify.verify_split` reads the rows of a dataset of ``kind``: keypoint rows by the
    YAML's ``kpt_shape``."""
    return {"kpt_shape": source.keypoint_layout().shape} if kind == "keypoints" else {}


DatasetChoice = tuple[type[DetectionDataset], dict[str, Any]]


def _boxes(index: LabelIndex, config: DataConfig, source: DatasetSource, split: str) -> DatasetChoice:
    return DetectionDataset, {}


def _masks(index: LabelIndex, config: DataConfig, source: DatasetSource, split: str) -> DatasetChoice:
    if not index.has_polygons:
        raise ValueError(f"{source.config or source.root or 'dataset'}: the {split} split has no polygon labels "
                         "(class x1 y1 x2 y2 ... per object, normalised), which a segmentation model trains on; "
                         "train a detection model on boxes")
    return SegmentationDataset, {"overlap": config.overlap_mask, "mask_ratio": config.mask_ratio}


def _keypoints(index: LabelIndex, config: DataConfig, source: DatasetSource, split: str) -> DatasetChoice:
    return PoseDataset, {"layout": source.keypoint_layout()}


def _rotated(index: LabelIndex, config: DataConfig, source: DatasetSource, split: str) -> DatasetChoice:
    return OBBDataset, {}


# What a task's labels are read as → the dataset class of a split and its own arguments (a task names its kind).
DATASET_KINDS: dict[str, Callable[[LabelIndex, DataConfig, DatasetSource, str], DatasetChoice]] = {
    "boxes": _boxes, "masks": _masks, "keypoints": _keypoints, "rotated": _rotated}


def run_class_names(names: list[str], config: DataConfig) -> list[str]:
    """The classes a run trains: the dataset's, or with ``single_cls`` one ('item' unless the data has one)."""
    if config.single_cls:
        return names if len(names) == 1 else ["item"]  # the reference's name for the one class
    return list(names)


def _classes(index: LabelIndex, config: DataConfig) -> LabelIndex:
    """The split as the run sees it: with ``single_cls`` every box is of class 0."""
    if not config.single_cls:
        return index
    labels = [np.concatenate((np.zeros_like(rows[:, :1]), rows[:, 1:]), 1) for rows in index.labels]
    return dataclasses.replace(index, labels=labels)


def reference_rect_order(index: LabelIndex) -> LabelIndex:
    """The split sorted by aspect ratio with the reference's own (default-kind) argsort.

    Which of several equal-aspect images lands in which rect batch decides its padded shape and so
    its detections; ordering them as the reference does makes results comparable image for image.
    The dataset's own stable sort then keeps this order.
    """
    shapes = np.asarray(index.shapes).reshape(-1, 2)
    return index.select((shapes[:, 1] / shapes[:, 0]).argsort())


class EpochBatchSampler(Sampler[list[SampleKey]]):
    """Batches of ``(index, epoch, mosaic)`` keys, shuffled from (seed, epoch) when ``shuffle``.

    The epoch and mosaic flag are read from the dataset when iteration starts, in the main process,
    and sent along with every index so persistent workers follow :meth:`DetectionDataset.set_epoch`
    and :meth:`DetectionDataset.close_mosaic`. Rectangular datasets keep their aspect-sorted order
    so each batch matches its precomputed shape.

    With ``world_size > 1`` (distributed training) every process walks the same global batches and
    takes its own contiguous share of each, so N processes together see exactly the batches one
    process would: a step on N processes equals a step on one.

    ``image_weights`` (set before an epoch, see :func:`image_weights`): the epoch's order is instead
    ``len(dataset)`` images drawn with replacement in proportion to these weights, from the same
    (seed, epoch) generator, so every process draws the same images.
    """

    def __init__(self, dataset: DetectionDataset, batch_size: int, shuffle: bool, seed: int = 0,
                 rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = shuffle and not dataset.rect
        self.seed = int(seed)
        self.rank = rank
        self.world_size = world_size
        self.image_weights: np.ndarray | None = None

    def __len__(self) -> int:
        return (len(self.dataset) + self.batch_size - 1) // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Same as ``dataset.set_epoch``: the next iteration uses this epoch's order and augmentations."""
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[SampleKey]]:
        n, epoch, mosaic = len(self.dataset), self.dataset.epoch, self.dataset.mosaic
        order = self.epoch_order(n, epoch)
        for start in range(0, n, self.batch_size):
            batch = order[start:start + self.batch_size]
            per_rank = -(-len(batch) // self.world_size)
            # A short last batch may leave a process without images; it repeats the batch's first so
            # every process still joins the gradient all-reduce.
            shard = batch[self.rank * per_rank:(self.rank + 1) * per_rank] if self.world_size > 1 else batch
            yield [(int(i), epoch, mosaic) for i in (shard if len(shard) else batch[:1])]

    def epoch_order(self, n: int, epoch: int) -> np.ndarray:
        """The dataset positions epoch ``epoch`` walks, before they are cut into batches and shares."""
        rng = np.random.default_rng([self.seed, epoch])
        if self.image_weights is not None:
            total = float(self.image_weights.sum())
            # No image has a weighted class (no labels, or every class at mAP 1): all are equally likely.
            p = self.image_weights / total if total > 0 else None
            return rng.choice(n, size=n, replace=True, p=p)
        return rng.permutation(n) if self.shuffle else np.arange(n)


def class_weights(labels: Sequence[np.ndarray], nc: int) -> np.ndarray:
    """Inverse class frequencies of ``labels`` (rows of class, box), normalised to sum to 1, as float32;
    a class without labels counts as one label (the reference's ``labels_to_class_weights``)."""
    rows = [rows[:, 0] for rows in labels if len(rows)]
    classes = np.concatenate(rows).astype(int) if rows else np.zeros(0, int)
    counts = np.bincount(classes, minlength=nc).astype(np.float64)
    counts[counts == 0] = 1
    weights = 1 / counts
    return (weights / weights.sum()).astype(np.float32)


def image_weights(labels: Sequence[np.ndarray], nc: int, class_maps: np.ndarray | None = None) -> np.ndarray:
    """The weight of each image for ``--image-weights``: the sum over its labels of their class weight, a class
    weighing its inverse frequency times ``(1 - mAP)**2`` (``class_maps``: the last validation's mAP50-95 per
    class; none yet: zeros), the reference's ``labels_to_image_weights`` of ``model.class_weights``."""
    maps = np.zeros(nc) if class_maps is None else np.asarray(class_maps, dtype=np.float64)
    weights = class_weights(labels, nc) * np.float32(nc) * (1 - maps) ** 2 / nc
    counts = np.stack([np.bincount(rows[:, 0].astype(int), minlength=nc) for rows in labels]) if len(labels) \
        else np.zeros((0, nc), int)
    return (weights.reshape(1, nc) * counts).sum(1)


def quad_batch(imgs: torch.Tensor, targets: torch.Tensor,
               upsample: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of ``B`` images ``[B,C,H,W]`` and targets (image, class, cx, cy, w, h) merged by groups of four
    into ``ceil(B/4)`` images ``[C,2H,2W]`` (the reference's ``collate_fn4``): group ``g``'s first image
    upsampled 2x with its own targets where ``upsample[g]``, else its four images tiled (first and second in
    the left column, third and fourth in the right) with all their targets. A last group short of four
    images is completed with the batch's first ones, so no loaded image is left out."""
    count = imgs.shape[0]
    groups = -(-count // 4)
    if count % 4:
        slots = torch.arange(count, groups * 4)
        extra = [torch.cat((torch.full_like(rows[:, :1], float(slot)), rows[:, 1:]), 1)
                 for slot in slots.tolist() for rows in [targets[targets[:, 0] == slot % count]]]
        imgs = torch.cat((imgs, imgs[slots % count]))
        targets = torch.cat((targets, *extra))
    c, h, w = imgs.shape[1:]
    quads = imgs.reshape(groups, 4, c, h, w)
    merged = torch.cat((torch.cat((quads[:, 0], quads[:, 1]), 2), torch.cat((quads[:, 2], quads[:, 3]), 2)), 3)
    up = torch.as_tensor(np.asarray(upsample, dtype=bool), device=imgs.device)
    if bool(up.any()):
        firsts = quads[up, 0]
        merged[up] = F.interpolate(firsts.float(), scale_factor=2.0, mode="bilinear",
                                   align_corners=False).to(imgs.dtype)
    image = targets[:, 0].long()
    group, member = image // 4, image % 4
    keep = ~up[group] | (member == 0)
    rows, group, member, tiled = targets[keep], group[keep], member[keep], ~up[group[keep]]
    offset = torch.stack(((member >= 2) & tiled, (member % 2 == 1) & tiled), 1).to(rows.dtype)
    scale = torch.where(tiled, 0.5, 1.0).to(rows.dtype)[:, None]
    boxes = torch.cat((rows[:, 2:4] + offset, rows[:, 4:6]), 1) * scale
    return merged, torch.cat((group.to(rows.dtype)[:, None], rows[:, 1:2], boxes), 1)


class QuadLoader:
    """The training loader with ``quad``: each batch of ``loader`` merged by :func:`quad_batch`, whose choice
    of upsampling or tiling per group is drawn from (seed, epoch, rank, batch), so it repeats on resume."""

    def __init__(self, loader: DataLoader, seed: int, rank: int) -> None:
        self.loader = loader
        self.dataset = loader.dataset
        self.batch_sampler = loader.batch_sampler
        self.num_workers = loader.num_workers
        self.seed = int(seed)
        self.rank = int(rank)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.dataset.epoch
        for index, batch in enumerate(self.loader):
            groups = -(-len(batch.imgs) // 4)
            upsample = np.random.default_rng([self.seed, epoch, self.rank, index]).random(groups) < 0.5
            imgs, targets = quad_batch(batch.imgs, batch.targets, upsample)
            yield dataclasses.replace(batch, imgs=imgs, targets=targets)


class WorkerLoader(DataLoader):
    """A DataLoader whose worker processes send images as uint8 (a quarter of the bytes through shared
    memory, the costliest part of a float batch) and that turns them to float32 0..1 here, into reused
    batch memory, pinned with CUDA (see :func:`~yolotrain.data.dataset.float_images`): batches are what
    the dataset's ``collate`` gives in one process."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.buffers = BatchBuffers()

    def __iter__(self) -> Iterator[Batch]:
        for batch in super().__iter__():
            yield dataclasses.replace(batch, imgs=float_images(batch.imgs, self.buffers))


def make_loader(
    dataset: DetectionDataset, batch_size: int, shuffle: bool, workers: int, seed: int = 0, rank: int = 0,
    world_size: int = 1,
) -> DataLoader:
    """DataLoader over ``dataset`` with seeded batches; persistent workers when ``workers > 0``.

    ``batch_size`` is the global batch; with ``world_size > 1`` this process gets its share of it.
    Batches are pinned with CUDA: collated or converted into pinned memory, so nothing is copied to pin them.
    """
    sampler = EpochBatchSampler(dataset, batch_size, shuffle, seed, rank, world_size)
    if not workers:
        return DataLoader(dataset, batch_sampler=sampler, pin_memory=torch.cuda.is_available(),
                          collate_fn=functools.partial(type(dataset).collate,
                                                       buffers=BatchBuffers(getattr(dataset, "threads", 1))))
    return WorkerLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        collate_fn=functools.partial(type(dataset).collate, uint8=True),
        persistent_workers=True,
        # No cv2.setNumThreads in workers: after the parent has used OpenCV's thread pool, calling it
        # in a forked child deadlocks.
    )


def get_loaders(
    db_root_dir: str | os.PathLike,
    batch_size: int,
    num_classes: int,
    img_size: int = 640,
    rect_training: bool = False,
    workers: int | None = None,
    augment: bool = True,
    seed: int = 0,
    hyp: AugmentConfig | Mapping[str, float] | None = None,
    cache_mb: float = DataConfig.cache_mb,
) -> tuple[DataLoader, DataLoader]:
    """Train and val loaders of a YOLO-layout folder or dataset YAML.

    Batches are ``(imgs, targets)``: float32 ``[B,3,H,W]`` RGB in 0..1, letterboxed with 114/255,
    and ``[N, 6]`` targets (image index, class, cx, cy, w, h) normalised to the batch image.
    The train loader shuffles and augments (mosaic, affine, HSV, flips per ``hyp``, default
    scratch-low) unless ``rect_training``, which keeps aspect-sorted batches with their own shapes
    and no mosaic. The val loader never augments and uses rectangular batches. Both are built by
    :func:`build_loaders`, exactly as training builds them.

    Args:
        db_root_dir: folder with ``images/{train,val}`` (or ``train2017``/``val2017``) and ``labels/``,
            or a dataset YAML.
        batch_size: images per batch.
        num_classes: label class ids must be below this.
        img_size: long side of the network input, a multiple of 32.
        rect_training: rectangular batches for training too.
        workers: loader processes; ``None`` means ``min(2, cpu count)``.
        augment: apply training augmentations.
        seed: seeds shuffling and augmentation; equal seeds give equal batches for any ``workers``.
        hyp: augmentation settings (an ``AugmentConfig``, or overrides of its defaults).
        cache_mb: per-process memory budget (MiB) for decoded images; 0 disables it.

    Raises:
        FileNotFoundError: the dataset, a split folder or its images are missing.
        ValueError: bad arguments (:class:`yolotrain.settings.ConfigError` for augmentation settings),
            or most labels use class ids ``>= num_classes``.
    """
    if batch_size < 1 or num_classes < 1:
        raise ValueError(f"batch_size and num_classes must be >= 1, got {batch_size} and {num_classes}")
    augmentation = AugmentConfig.coerce(hyp) if augment else None
    config = DataConfig(path=os.fspath(db_root_dir), img_size=img_size, batch_size=batch_size, workers=workers,
                        rect=rect_training, cache_mb=cache_mb)
    loaders = build_loaders(config, augmentation, num_classes=num_classes, seed=seed)
    if loaders.names and len(loaders.names) != num_classes:
        warnings.warn(f"{db_root_dir}: dataset names {len(loaders.names)} classes, num_classes is {num_classes}",
                      DataWarning, stacklevel=2)
    return loaders.train, loaders.val
