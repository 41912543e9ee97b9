"""The loaders' named batch: unpacking, wrappers' replacements and pinning."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch.utils.data._utils.pin_memory import pin_memory

from yolotrain.data.batch import Batch
from yolotrain.data.segment import SegmentBatch


def segment_batch() -> SegmentBatch:
    return SegmentBatch(torch.rand(2, 3, 8, 8), torch.zeros(3, 6), [Path("a.jpg"), Path("b.jpg")], [None, None],
                        torch.ones(2, 2, 2))


def test_every_batch_unpacks_to_its_images_and_targets():
    imgs, targets = torch.rand(2, 3, 8, 8), torch.tensor([0, 1])
    assert tuple(Batch(imgs, targets)) == (imgs, targets)
    batch = segment_batch()
    unpacked_imgs, unpacked_targets = batch
    assert unpacked_imgs is batch.imgs and unpacked_targets is batch.targets


def test_a_replaced_image_tensor_keeps_the_tasks_own_fields():
    batch = segment_batch()
    resized = dataclasses.replace(batch, imgs=torch.zeros(2, 3, 4, 4))
    assert isinstance(resized, SegmentBatch) and resized.masks is batch.masks and resized.paths == batch.paths
    assert resized.imgs.shape == (2, 3, 4, 4) and batch.imgs.shape == (2, 3, 8, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs a CUDA GPU")
def test_the_loaders_pinning_pins_every_tensor_of_the_batch():
    batch = segment_batch()
    pinned = pin_memory(batch)  # what DataLoader(pin_memory=True) does to each batch
    assert isinstance(pinned, SegmentBatch) and pinned.paths == batch.paths
    assert pinned.imgs.is_pinned() and pinned.targets.is_pinned() and pinned.masks.is_pinned()
    assert torch.equal(pinned.masks, batch.masks) and not batch.masks.is_pinned()
