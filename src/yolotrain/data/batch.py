"""The batch a training or validation loader yields: named fields, not positions."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """A loader's batch: ``imgs`` ``[B, 3, H, W]`` and ``targets`` (detection, segmentation and pose: ``[N, 6]`` rows
    of image index, class, cx, cy, w, h; oriented boxes: ``[N, 7]``, the angle after them; classification: ``[B]``
    class indices).

    A task's dataset may subclass it with fields of its own (segmentation's
    :class:`~yolotrain.data.segment.SegmentBatch` adds paths, shapes and masks, pose's
    :class:`~yolotrain.data.pose.PoseBatch` keypoints), which the task's own code reads
    by name. Unpacking gives ``(imgs, targets)`` for every batch type, so ``for imgs, targets in loader:`` works
    whatever the task; that is the one unpacking, never more positions. Wrappers that change the images or
    targets keep the other fields with :func:`dataclasses.replace`.
    """

    imgs: torch.Tensor
    targets: torch.Tensor

    def __iter__(self) -> Iterator[torch.Tensor]:
        yield self.imgs
        yield self.targets

    def pin_memory(self) -> Batch:
        """A copy with its tensors in pinned memory: torch's loader calls this to pin a batch for CUDA (an object
        without it would stay in pageable memory)."""
        pinned = {field.name: value.pin_memory() for field in dataclasses.fields(self)
                  if isinstance(value := getattr(self, field.name), torch.Tensor)}
        return dataclasses.replace(self, **pinned)
