"""Evaluation and inference: NMS, metrics (AP), COCO export/evaluation, validation, prediction, plots."""

from ..nms import VAL_NMS, NMSConfig, non_max_suppression, scale_boxes_to_original
from .metrics import ConfusionMatrix, Metrics
from .predict import PredictConfig, Predictor, Result, SourceWarning, add_predict_arguments, predict, run_predict
from .val import ValConfig, add_val_arguments, run_val, val

__all__ = ["VAL_NMS", "ConfusionMatrix", "Metrics", "NMSConfig", "PredictConfig", "Predictor", "Result",
           "SourceWarning", "ValConfig", "add_predict_arguments", "add_val_arguments", "non_max_suppression",
           "predict", "run_predict", "run_val", "scale_boxes_to_original", "val"]
