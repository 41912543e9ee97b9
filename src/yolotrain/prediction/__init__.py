"""Prediction: ``predict()`` over images, folders, globs, videos, cameras and streams (``run.py``), the results
it yields (boxes, masks, class probabilities: ``result_outputs.py``, ``result_boxes.py``, ``classify.py``), live
sources (``streams.py``) and ``--visualize``'s feature maps (``visualize.py``)."""

from .classify import ClassifyResult
from .run import PredictConfig, Predictor, Result, SourceWarning, add_predict_arguments, predict, run_predict

__all__ = ["ClassifyResult", "PredictConfig", "Predictor", "Result", "SourceWarning", "add_predict_arguments",
           "predict", "run_predict"]
