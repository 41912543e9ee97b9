"""Build the train and val DataLoaders of a dataset folder or YAML."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from .dataset import DEFAULT_CACHE_MB, DetectionDataset, SampleKey
from .sources import resolve_source
from .verify import DataWarning, verify_split


class EpochBatchSampler(Sampler[list[SampleKey]]):
    """Batches of ``(index, epoch, mosaic)`` keys, shuffled from (seed, epoch) when ``shuffle``.

    The epoch and mosaic flag are read from the dataset when iteration starts, in the main process,
    and sent along with every index so persistent workers follow :meth:`DetectionDataset.set_epoch`
    and :meth:`DetectionDataset.close_mosaic`. Rectangular datasets keep their aspect-sorted order
    so each batch matches its precomputed shape.

    With ``world_size > 1`` (distributed training) every process walks the same global batches and
    takes its own contiguous share of each, so N processes together see exactly the batches one
    process would: a step on N processes equals a step on one.
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

    def __len__(self) -> int:
        return (len(self.dataset) + self.batch_size - 1) // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Same as ``dataset.set_epoch``: the next iteration uses this epoch's order and augmentations."""
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[SampleKey]]:
        n, epoch, mosaic = len(self.dataset), self.dataset.epoch, self.dataset.mosaic
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        for start in range(0, n, self.batch_size):
            batch = order[start:start + self.batch_size]
            per_rank = -(-len(batch) // self.world_size)
            # A short last batch may leave a process without images; it repeats the batch's first so
            # every process still joins the gradient all-reduce.
            shard = batch[self.rank * per_rank:(self.rank + 1) * per_rank] if self.world_size > 1 else batch
            yield [(int(i), epoch, mosaic) for i in (shard if len(shard) else batch[:1])]


def make_loader(
    dataset: DetectionDataset, batch_size: int, shuffle: bool, workers: int, seed: int = 0, rank: int = 0,
    world_size: int = 1,
) -> DataLoader:
    """DataLoader over ``dataset`` with seeded batches; persistent workers when ``workers > 0``.

    ``batch_size`` is the global batch; with ``world_size > 1`` this process gets its share of it.
    """
    return DataLoader(
        dataset,
        batch_sampler=EpochBatchSampler(dataset, batch_size, shuffle, seed, rank, world_size),
        num_workers=workers,
        collate_fn=DetectionDataset.collate,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=workers > 0,
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
    hyp: Mapping[str, float] | None = None,
    cache_mb: float = DEFAULT_CACHE_MB,
) -> tuple[DataLoader, DataLoader]:
    """Train and val loaders of a YOLO-layout folder or dataset YAML.

    Batches are ``(imgs, targets)``: float32 ``[B,3,H,W]`` RGB in 0..1, letterboxed with 114/255,
    and ``[N, 6]`` targets (image index, class, cx, cy, w, h) normalised to the batch image.
    The train loader shuffles and augments (mosaic, affine, HSV, flips per ``hyp``, default
    scratch-low) unless ``rect_training``, which keeps aspect-sorted batches with their own shapes
    and no mosaic. The val loader never augments and uses rectangular batches.

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
        hyp: overrides of the augmentation settings.
        cache_mb: per-process memory budget (MiB) for decoded training images; 0 disables it.
            Validation images are read once per epoch and are not kept.

    Raises:
        FileNotFoundError: the dataset, a split folder or its images are missing.
        ValueError: bad arguments, or most labels use class ids ``>= num_classes``.
    """
    if img_size <= 0 or img_size % 32:
        raise ValueError(f"img_size must be a positive multiple of 32, got {img_size}")
    if batch_size < 1 or num_classes < 1:
        raise ValueError(f"batch_size and num_classes must be >= 1, got {batch_size} and {num_classes}")
    workers = min(2, os.cpu_count() or 1) if workers is None else int(workers)
    src = resolve_source(db_root_dir)
    if src.names and len(src.names) != num_classes:
        warnings.warn(f"{db_root_dir}: dataset names {len(src.names)} classes, num_classes is {num_classes}",
                      DataWarning, stacklevel=2)
    train_index = verify_split(src.train, num_classes, "train")
    val_index = train_index if src.val == src.train else verify_split(src.val, num_classes, "val")
    train = DetectionDataset(train_index, img_size, batch_size, augment=augment, hyp=hyp, rect=rect_training,
                             pad=0.0, seed=seed, names=src.names, cache_mb=cache_mb)
    val = DetectionDataset(val_index, img_size, batch_size, augment=False, rect=True, pad=0.5, seed=seed,
                           names=src.names, cache_mb=0)
    train_loader = make_loader(train, batch_size, True, workers, seed)
    return train_loader, make_loader(val, batch_size, False, workers, seed)
