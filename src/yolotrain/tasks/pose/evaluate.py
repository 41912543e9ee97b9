"""Pose's answers to evaluation and prediction, where they differ from detection's: its models' decoded rows end
in the keypoints (``K*D`` columns that NMS carries like mask coefficients), so val scores them by OKS too, writes
them in its label rows and COCO results, and predict's results carry them in original-image pixels."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...data.batch import Batch
from ...data.pose import PoseBatch
from ...eval.coco import coco_evaluate
from ...eval.metrics import Metrics, ScoringRules
from ...eval.plots import save_val_batch
from ...eval.pose import PoseStats, oks_sigmas
from ...eval.val import validate_detections


@dataclass(frozen=True)
class ImageKeypoints:
    """One val image's label keypoints ``[m, K, D]`` in the batch input's pixels (rows in its targets' order),
    and how that input maps to the original image: original = (input - pad) / gain."""

    points: torch.Tensor
    gain: tuple[float, float]
    pad: tuple[float, float]

    def original(self, points: torch.Tensor) -> torch.Tensor:
        """``points`` ``[..., K, D]`` of the input's pixels in the original image's (other values kept)."""
        xy = (points[..., :2] - points.new_tensor(self.pad)) / points.new_tensor(self.gain)
        return torch.cat((xy, points[..., 2:]), -1)


def detection_keypoints(det: torch.Tensor, kpt_shape: tuple[int, int]) -> torch.Tensor:
    """The ``[n, K, D]`` keypoints of NMS rows ``[n, 6 + K*D]`` (x, y in the rows' pixels, D == 3: visibility)."""
    return det[:, 6:].reshape(len(det), *kpt_shape)


def keypoints_to_original(points: torch.Tensor, gain: tuple[float, float], pad: tuple[float, float],
                          original_hw: tuple[int, int]) -> torch.Tensor:
    """Keypoints ``[n, K, D]`` of the network input in original-image pixels, clipped to the image (as boxes are)."""
    h0, w0 = original_hw
    xy = (points[..., :2] - points.new_tensor(pad)) / points.new_tensor(gain)
    xy = torch.stack((xy[..., 0].clamp(0, w0), xy[..., 1].clamp(0, h0)), -1)
    return torch.cat((xy, points[..., 2:]), -1)


class PoseEvaluation:
    """Pose's answers to val, predict, inference and tracking where keypoints change detection's."""

    # Where each detection's keypoints go in its COCO result (``original_masks``' first value).
    coco_result_field = "keypoints"
    # The keypoints of the model being validated or predicted with: set on the copy of the task that
    # ``validate`` and ``predictor`` run with (the registered task serves every model).
    kpt_shape: tuple[int, int] = (0, 0)

    def for_model(self, model: Any) -> PoseEvaluation:
        """A copy of this task that reads ``model``'s rows: its ``kpt_shape``."""
        bound = copy.copy(self)
        bound.kpt_shape = tuple(int(v) for v in model.kpt_shape)
        return bound

    def validate(self, model: Any, model_or_weights: Any, data: Any, device: torch.device, **settings: Any) -> Metrics:
        return validate_detections(self.for_model(model), model, model_or_weights, data, device, **settings)

    def predictor(self, predictor: Any, img_size: int | None, save_crop: bool) -> Any:
        predictor.task = self.for_model(predictor.model)
        return predictor

    def augment_refusal(self, name: str) -> str | None:
        return f"--augment flips and rescales boxes only: {name} is a pose model, whose keypoints it would lose"

    def ensemble_refusal(self, name: str) -> str | None:
        return f"an ensemble (several --weights) merges detection models' boxes: {name} is a pose model"

    def slicing_refusal(self, name: str) -> str | None:
        return f"--slice moves the tiles' boxes into the image, not keypoints: {name} is a pose model"

    def check_inference(self, model: Any) -> None:
        if model.end_to_end:
            raise ValueError("a pose export with NMS inside has no keypoints: export it without --nms")

    def nms_extra_columns(self, model: Any) -> int:
        keypoints, dims = model.kpt_shape
        return keypoints * dims

    def val_loss(self, criterion: Any, maps: Any, protos: torch.Tensor | None, targets: torch.Tensor, batch: Batch,
                 device: torch.device, pred_size: tuple[int, int]) -> None:
        if not isinstance(batch, PoseBatch):
            raise ValueError("the validation loss of a pose model needs batches with keypoints (a pose data loader)")
        criterion(maps, targets, batch.keypoints.to(device), pred_size=pred_size)

    def batch_label_masks(self, batch: Batch, dataset: Any, targets: torch.Tensor) -> list[torch.Tensor] | None:
        """Per image, its rows' keypoints ``[m, K, D]`` in the batch's pixels, in the order of its targets rows."""
        if not isinstance(batch, PoseBatch):
            raise ValueError("val of a pose model needs keypoint labels: a dataset YAML with kpt_shape")
        h, w = batch.imgs.shape[-2:]
        points = batch.keypoints.to(targets.device).clone()
        points[..., 0] *= w
        points[..., 1] *= h
        image_of = targets[:, 0].long()
        counts = torch.bincount(image_of, minlength=batch.imgs.shape[0]).tolist()
        return list(points[image_of.argsort(stable=True)].split(counts))

    def save_val_batch(self, out_dir: Path, index: int, batch: Batch, targets: torch.Tensor, dets: list[torch.Tensor],
                       names: list[str], overlap: bool, protos: torch.Tensor | None) -> None:
        """The val_batch pictures with the labels' and the detections' keypoints."""
        save_val_batch(out_dir, index, batch.imgs, targets, dets, names, None, overlap, protos,
                       label_keypoints=batch.keypoints if isinstance(batch, PoseBatch) else None,
                       kpt_shape=self.kpt_shape)

    def read_label_masks(self, label_masks: list[torch.Tensor] | None, dataset: Any, first: int, count: int,
                         shape: tuple[int, int], resized: np.ndarray, pads: np.ndarray) -> list[ImageKeypoints]:
        sizes = np.asarray(dataset.shapes[first:first + count], dtype=np.float64).reshape(-1, 2)
        gains = resized / sizes
        return [ImageKeypoints(points, tuple(gain), tuple(pad)) for points, gain, pad in zip(label_masks, gains, pads)]

    def val_stats(self, nc: int, rules: ScoringRules) -> PoseStats:
        return PoseStats(nc, sigmas=oks_sigmas(*self.kpt_shape), rules=rules)

    def score_image(self, stats: PoseStats, det: torch.Tensor, det_native: torch.Tensor,
                    gt_boxes: torch.Tensor, gt_cls: torch.Tensor, proto: torch.Tensor | None,
                    label_keypoints: ImageKeypoints, shape: tuple[int, int]) -> None:
        gt_points = label_keypoints.points.to(det.device)
        pred_points = detection_keypoints(det, self.kpt_shape)
        if not stats.rules.input_pixels:  # boxes compared in original pixels: so are the keypoints
            gt_points, pred_points = label_keypoints.original(gt_points), label_keypoints.original(pred_points)
        stats.update_keypoints(det_native, gt_boxes, gt_cls, pred_points, gt_points)

    def original_masks(self, proto: torch.Tensor | None, det: torch.Tensor, det_native: torch.Tensor,
                       input_hw: tuple[int, int], pad: np.ndarray, resized: np.ndarray, original_hw: tuple[int, int],
                       rle: bool, polygons: bool) -> tuple[list[list[float]] | None, list[np.ndarray] | None]:
        """The detections' keypoints in original pixels: as COCO's flat ``[x, y, v, ...]`` lists (v: the predicted
        visibility, 1 without one) and as ``[K, D]`` arrays."""
        h0, w0 = original_hw
        gain = (float(resized[0]) / w0, float(resized[1]) / h0)
        points = keypoints_to_original(detection_keypoints(det, self.kpt_shape).double(), gain,
                                       (float(pad[0]), float(pad[1])), original_hw).cpu()
        arrays = [p.numpy() for p in points]
        coco = None
        if rle:
            with_v = points if points.shape[-1] == 3 else torch.cat((points, points.new_ones(*points.shape[:2], 1)), -1)
            coco = [[round(v, 3) for v in p.reshape(-1).tolist()] for p in with_v]
        return coco, arrays

    def label_rows(self, det: torch.Tensor, keypoints: list[np.ndarray] | None, shape: tuple[int, int],
                   with_conf: bool) -> str:
        """Ultralytics' pose rows, ``class cx cy w h x y [v] ... [conf]`` normalised to the ``(h, w)`` image."""
        return pose_rows(det, keypoints or [], shape, with_conf)

    def coco_label_fields(self, dataset: Any) -> dict[str, Any]:
        return {"keypoints": dataset.keypoints}

    def coco_masks(self, metrics: Metrics, out_dir: Path) -> None:
        if metrics.keypoints is not None:
            metrics.keypoints.coco = coco_evaluate(out_dir / "ground_truth.json", out_dir / "predictions.json",
                                                   iou_type="keypoints",
                                                   keypoint_sigmas=oks_sigmas(*self.kpt_shape).tolist())

    def result_fields(self, proto: torch.Tensor | None, det: torch.Tensor, boxes: torch.Tensor,
                      input_hw: tuple[int, int], gain: tuple[float, float], pad: tuple[float, float],
                      original_hw: tuple[int, int], retina_masks: bool) -> dict[str, Any]:
        """A prediction's ``keypoints`` ``[n, K, D]`` (float32, original-image pixels, D == 3: visibility)."""
        points = keypoints_to_original(detection_keypoints(det, self.kpt_shape).float(), gain, pad,
                                       original_hw)
        return {"keypoints": points.cpu().numpy()}



def pose_rows(det: torch.Tensor, keypoints: list[np.ndarray], shape: tuple[int, int], with_conf: bool) -> str:
    """YOLO pose rows of xyxy detections and their ``[K, D]`` keypoints (original pixels), normalised to the
    ``(h, w)`` image: ``class cx cy w h x0 y0 [v0] ... [conf]``, numbers as ``%g``."""
    h, w = shape
    d = det.double().cpu()
    lines = []
    for row, points in zip(d.tolist(), keypoints):
        x1, y1, x2, y2, score, cls = row[:6]
        normalised = np.asarray(points, np.float64).copy()
        normalised[:, 0] /= w
        normalised[:, 1] /= h
        values = [cls, (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h,
                  *normalised.reshape(-1).tolist()] + ([score] if with_conf else [])
        lines.append(" ".join(f"{v:g}" for v in values) + "\n")
    return "".join(lines)
