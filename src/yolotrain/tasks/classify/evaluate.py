"""Classification's answers to evaluation and prediction: top-1/top-5 accuracy for val and the top five
classes of each image for predict (both in :mod:`yolotrain.eval.classify`); a classifier has no boxes, so
the options made for boxes (test-time augmentation, ensembles, crops, tracking) are refused in one line."""

from __future__ import annotations

import os
from typing import Any

import torch

from ...eval.classify import ClassifyMetrics, val_classifier
from ...prediction.classify import ClassifyPredictor


class ClassifyEvaluation:
    """Classification's answers to val, predict, inference and tracking."""

    def augment_refusal(self, name: str) -> str | None:
        return f"--augment: the reference's classification has no test-time augmentation; {name} is a classifier"

    def check_inference(self, model: Any) -> None:
        return None  # every model of the task runs

    def ensemble_refusal(self, name: str) -> str | None:
        return f"an ensemble (several --weights) merges detection models' boxes: {name} is a classifier"

    def slicing_refusal(self, name: str) -> str | None:
        return (f"--slice merges the boxes of detection and segmentation models across tiles: {name} is a "
                "classifier, which has no boxes")

    def validate(self, model: Any, model_or_weights: Any, data: Any, device: torch.device, *,
                 img_size: int | None, batch_size: int, workers: int | None, criterion: Any, save_dir: Any,
                 plots: bool, verbose: bool, hooks: Any, **detection_settings: Any) -> ClassifyMetrics:
        # The NMS, class-mapping and label-file settings are detection's: a classifier's score has none.
        weights = model_or_weights if isinstance(model_or_weights, (str, os.PathLike)) else None
        return val_classifier(model, data, device, img_size=img_size, batch_size=batch_size, workers=workers,
                              criterion=criterion, save_dir=save_dir, plots=plots, verbose=verbose, weights=weights,
                              hooks=hooks)

    def predictor(self, predictor: Any, img_size: int | None, save_crop: bool) -> ClassifyPredictor:
        if save_crop:
            raise ValueError("save_crop cuts out detected boxes: a classifier has none")
        return ClassifyPredictor(predictor.model, predictor.device, img_size)

    def track_refusal(self, name: str) -> str | None:
        return (f"track follows detected boxes from frame to frame: {name} is a classifier, which has no boxes to "
                "track; give detection or segmentation weights")
