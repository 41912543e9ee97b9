"""Detection's answers to evaluation and prediction: how its models are readied, validated (the shared loop of
:func:`yolotrain.eval.val.validate_detections`) and predicted with, and what is made of their boxes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...boxes import xywh_to_xyxy
from ...data.batch import Batch
from ...eval.coco import detections_to_coco
from ...eval.metrics import ConfusionMatrix, DetectionStats, Metrics, ScoringRules
from ...eval.plots import save_val_batch
from ...eval.val import validate_detections
from ...nms import VAL_NMS, non_max_suppression, scale_boxes_to_original


class DetectEvaluation:
    """Detection's answers to val, predict, inference and tracking: boxes only (segmentation adds its masks
    to these answers)."""

    # The key of a COCO result that holds each detection's first value of ``original_masks`` (a mask's RLE).
    coco_result_field = "segmentation"

    def augment_refusal(self, name: str) -> str | None:
        return None

    def check_inference(self, model: Any) -> None:
        return None  # every model of the task runs

    def ensemble_refusal(self, name: str) -> str | None:
        return None

    def slicing_refusal(self, name: str) -> str | None:
        return None

    def validate(self, model: Any, model_or_weights: Any, data: Any, device: torch.device, **settings: Any) -> Metrics:
        return validate_detections(self, model, model_or_weights, data, device, **settings)

    def predictor(self, predictor: Any, img_size: int | None, save_crop: bool) -> Any:
        return predictor

    def track_refusal(self, name: str) -> str | None:
        return None

    # What validation and prediction do with a batch's outputs (yolotrain.eval.val.DetectionValidation).

    def infer(self, model: Any, imgs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return model(imgs), None

    def nms_extra_columns(self, model: Any) -> int:
        return 0

    coco_scoring = True  # --save-json's boxes are scored by pycocotools

    def suppress(self, predictions: torch.Tensor, conf: float, iou: float, classes: Sequence[int] | None = None,
                 agnostic: bool = False, multi_label: bool = False, max_det: int = VAL_NMS.max_det,
                 num_extra: int = 0) -> list[torch.Tensor]:
        """Axis-aligned NMS: xyxy, score, class (and the extra columns) per detection."""
        return non_max_suppression(predictions, conf, iou, classes, agnostic, multi_label=multi_label,
                                   max_det=max_det, num_extra=num_extra)

    def label_boxes(self, labels: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        h, w = shape
        return xywh_to_xyxy(labels[:, :4] * labels.new_tensor((w, h, w, h)))

    def original_boxes(self, rows: torch.Tensor, gain: tuple[float, float], pad: tuple[float, float],
                       original_hw: tuple[int, int]) -> torch.Tensor:
        """xyxy clipped to the image, then score and class (a segmentation model's coefficients left out)."""
        return torch.cat((scale_boxes_to_original(rows[:, :4], gain, pad, original_hw), rows[:, 4:6]), 1)

    def confusion_matrix(self, nc: int) -> ConfusionMatrix | None:
        return ConfusionMatrix(nc)

    def json_detections(self, det_native: torch.Tensor, image_id: int) -> list[dict]:
        return detections_to_coco(det_native, image_id)

    def save_val_batch(self, out_dir: Path, index: int, batch: Batch, targets: torch.Tensor, dets: list[torch.Tensor],
                       names: list[str], overlap: bool, protos: torch.Tensor | None) -> None:
        save_val_batch(out_dir, index, batch.imgs, targets, dets, names, self.plot_label_masks(batch), overlap, protos)

    def split_maps(self, maps: Any) -> tuple[Any, torch.Tensor | None]:
        return maps, None

    def val_loss(self, criterion: Any, maps: Any, protos: torch.Tensor | None, targets: torch.Tensor, batch: Batch,
                 device: torch.device, pred_size: tuple[int, int]) -> None:
        criterion(maps, targets, pred_size=pred_size)

    def batch_label_masks(self, batch: Batch, dataset: Any, targets: torch.Tensor) -> list[torch.Tensor] | None:
        return None

    def plot_label_masks(self, batch: Batch) -> torch.Tensor | None:
        return None

    def val_stats(self, nc: int, rules: ScoringRules) -> DetectionStats:
        return DetectionStats(nc, rules=rules)

    def read_label_masks(self, label_masks: list[torch.Tensor] | None, dataset: Any, first: int, count: int,
                         shape: tuple[int, int], resized: np.ndarray,
                         pads: np.ndarray) -> list[torch.Tensor] | None:
        return label_masks

    def score_image(self, stats: DetectionStats, det: torch.Tensor, det_native: torch.Tensor,
                    gt_boxes: torch.Tensor, gt_cls: torch.Tensor, proto: torch.Tensor | None,
                    label_masks: torch.Tensor | None, shape: tuple[int, int]) -> None:
        stats.update(det_native, gt_boxes, gt_cls)

    def original_masks(self, proto: torch.Tensor | None, det: torch.Tensor, det_native: torch.Tensor,
                       input_hw: tuple[int, int], pad: np.ndarray, resized: np.ndarray, original_hw: tuple[int, int],
                       rle: bool, polygons: bool) -> tuple[list[dict] | None, list[np.ndarray] | None]:
        return None, None

    def label_rows(self, det: torch.Tensor, polygons: list[np.ndarray] | None, shape: tuple[int, int],
                   with_conf: bool) -> str:
        return yolo_rows(det, shape, with_conf)

    def coco_label_fields(self, dataset: Any) -> dict[str, Any]:
        return {}

    def coco_masks(self, metrics: Metrics, out_dir: Path) -> None:
        return None

    def result_boxes(self, det_native: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A prediction's xyxy boxes in the original image (:class:`~yolotrain.prediction.run.Result`'s ``boxes``)
        and its rotated boxes (``rotated``; a detection model has none), from :meth:`original_boxes`."""
        return det_native[:, :4], None


    def result_fields(self, proto: torch.Tensor | None, det: torch.Tensor, boxes: torch.Tensor,
                      input_hw: tuple[int, int], gain: tuple[float, float], pad: tuple[float, float],
                      original_hw: tuple[int, int], retina_masks: bool) -> dict[str, Any]:
        """A prediction's fields of :class:`~yolotrain.prediction.run.Result` beside its boxes, in the original
        image (a segmentation model's ``masks`` and ``polygons``): a detection model has none."""
        return {}


def yolo_rows(det: torch.Tensor, shape: tuple[int, int], with_conf: bool) -> str:
    """YOLO label rows (``class cx cy w h [conf]``, normalised to the ``(h, w)`` image) of xyxy detections,
    numbers written as the reference's ``%g``."""
    h, w = shape
    d = det.double().cpu()
    xywhn = torch.stack(((d[:, 0] + d[:, 2]) / 2 / w, (d[:, 1] + d[:, 3]) / 2 / h,
                         (d[:, 2] - d[:, 0]) / w, (d[:, 3] - d[:, 1]) / h), 1)
    columns = [d[:, 5:6], xywhn] + ([d[:, 4:5]] if with_conf else [])
    return "".join(" ".join(f"{v:g}" for v in row) + "\n" for row in torch.cat(columns, 1).tolist())
