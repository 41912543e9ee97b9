"""Segmentation's training: detection's, with the loader's target masks (the family's segmentation loss takes
them), and the mask results' columns and tags."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ...data.segment import SegmentBatch
from ..detect.train import TAGS as DETECT_TAGS
from ..detect.train import DetectTraining

# Validation metrics' columns of results.csv: box and mask results (the loss parts follow).
RESULT_METRICS = ("precision", "recall", "mAP50", "mAP50-95", "mask_precision", "mask_recall",
                  "mask_mAP50", "mask_mAP50-95")
# results.csv column → TensorBoard tag: detection's, and the reference's segment/train.py ones.
TAGS = {**DETECT_TAGS, "train_seg": "train/seg_loss", "val_seg": "val/seg_loss",
        "mask_precision": "metrics/precision(M)", "mask_recall": "metrics/recall(M)",
        "mask_mAP50": "metrics/mAP_0.5(M)", "mask_mAP50-95": "metrics/mAP_0.5:0.95(M)"}


class SegmentTraining(DetectTraining):
    """Segmentation's answers to the engine where they differ from detection's."""

    dataset_kind = "masks"  # batches with the target masks

    def batch_masks(self, batch: SegmentBatch) -> torch.Tensor | None:
        """A segmentation batch's target masks (see :class:`~yolotrain.data.segment.SegmentBatch`)."""
        return batch.masks

    def training_targets(self, batch: SegmentBatch, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The ``[N, 6]`` rows and the target masks, which the loss resizes to the prototypes' size."""
        return batch.targets.to(device, non_blocking=True), batch.masks.to(device, non_blocking=True)

    @property
    def result_columns(self) -> tuple[str, ...]:
        return RESULT_METRICS

    @property
    def logger_tags(self) -> Mapping[str, str]:
        return TAGS
