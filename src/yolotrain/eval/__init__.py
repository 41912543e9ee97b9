"""Evaluation: NMS, metrics (AP), COCO export/evaluation, validation, plots, and the inference models val and
prediction share (test-time augmentation, ensembles)."""

from ..nms import VAL_NMS, NMSConfig, non_max_suppression, scale_boxes_to_original
from .metrics import ConfusionMatrix, Metrics
from .val import ValConfig, add_val_arguments, run_val, val

__all__ = ["VAL_NMS", "ConfusionMatrix", "Metrics", "NMSConfig", "ValConfig", "add_val_arguments",
           "non_max_suppression", "run_val", "scale_boxes_to_original", "val"]
