"""Oriented boxes' answers to evaluation and prediction, where rotation changes detection's: the rotated NMS
(ProbIoU), labels and detections as xywhr (cx, cy, w, h, angle), scored by ProbIoU
(:class:`~yolotrain.eval.obb.RotatedDetectionStats`), written as DOTA's 8-point rows and drawn as polygons."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from ...data.batch import Batch
from ...eval.metrics import ConfusionMatrix, ScoringRules
from ...eval.obb import RotatedDetectionStats
from ...eval.plots import PLOT_CONF
from ...nms import VAL_NMS, rotated_non_max_suppression
from ...rotated import xywhr_to_corners
from ..detect.evaluate import DetectEvaluation
from .plots import draw_rotated_batch


def rotated_columns(det: torch.Tensor) -> torch.Tensor:
    """The ``[n, 5]`` xywhr of detections ``[n, 7]`` (cx, cy, w, h, score, class, angle)."""
    return torch.cat((det[:, :4], det[:, 6:7]), 1)


def dota_rows(det: torch.Tensor, shape: tuple[int, int], with_conf: bool) -> str:
    """DOTA-style label rows ``class x1 y1 x2 y2 x3 y3 x4 y4 [conf]`` (the corners normalised to the ``(h, w)``
    image, as Ultralytics' OBB ``--save-txt`` writes them) of detections ``[n, 7]`` in its pixels."""
    h, w = shape
    d = det.double().cpu()
    corners = (xywhr_to_corners(rotated_columns(d)) / d.new_tensor((w, h))).reshape(-1, 8)
    columns = [d[:, 5:6], corners] + ([d[:, 4:5]] if with_conf else [])
    return "".join(" ".join(f"{v:g}" for v in row) + "\n" for row in torch.cat(columns, 1).tolist())


class OBBEvaluation(DetectEvaluation):
    """Oriented boxes' answers to val, predict, inference and tracking."""

    coco_scoring = False  # pycocotools has no rotated boxes: --save-json writes the detections alone

    def augment_refusal(self, name: str) -> str | None:
        return f"--augment merges axis-aligned boxes of flipped and scaled images: {name} predicts rotated boxes"

    def ensemble_refusal(self, name: str) -> str | None:
        return f"an ensemble (several --weights) merges axis-aligned boxes: {name} predicts rotated boxes"

    def track_refusal(self, name: str) -> str | None:
        return (f"track follows axis-aligned boxes from frame to frame: {name} predicts rotated boxes "
                "(predict them frame by frame instead)")

    def suppress(self, predictions: torch.Tensor, conf: float, iou: float, classes: Sequence[int] | None = None,
                 agnostic: bool = False, multi_label: bool = False, max_det: int = VAL_NMS.max_det,
                 num_extra: int = 0) -> list[torch.Tensor]:
        """The rotated NMS (ProbIoU): cx, cy, w, h, score, class, angle per detection."""
        return rotated_non_max_suppression(predictions, conf, iou, classes, agnostic, multi_label=multi_label,
                                           max_det=max_det)

    def label_boxes(self, labels: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        h, w = shape
        return torch.cat((labels[:, :4] * labels.new_tensor((w, h, w, h)), labels[:, 4:5]), 1)

    def original_boxes(self, rows: torch.Tensor, gain: tuple[float, float], pad: tuple[float, float],
                       original_hw: tuple[int, int]) -> torch.Tensor:
        """The centre moved and scaled, the sides scaled, the angle and other columns kept; not clipped (a
        rotated box's corners may leave the image), as the reference maps them."""
        scale = rows.new_tensor((gain[0], gain[1], gain[0], gain[1]))
        offset = rows.new_tensor((pad[0], pad[1], 0.0, 0.0))
        return torch.cat(((rows[:, :4] - offset) / scale, rows[:, 4:]), 1)

    def val_stats(self, nc: int, rules: ScoringRules) -> RotatedDetectionStats:
        return RotatedDetectionStats(nc, rules=rules)

    def confusion_matrix(self, nc: int) -> ConfusionMatrix | None:
        return None  # its matching is by axis-aligned IoU; rotated boxes are scored by the mAP's ProbIoU alone

    def json_detections(self, det_native: torch.Tensor, image_id: int) -> list[dict]:
        """Ultralytics' OBB entries: ``rbox`` (cx, cy, w, h, angle) and ``poly`` (its 4 corners), in pixels."""
        d = det_native.double()
        boxes = rotated_columns(d)
        corners = xywhr_to_corners(boxes).reshape(-1, 8)
        return [{"image_id": image_id, "category_id": int(c), "score": round(s, 5),
                 "rbox": [round(v, 3) for v in box[:4]] + [round(box[4], 6)], "poly": [round(v, 3) for v in poly]}
                for box, poly, s, c in zip(boxes.tolist(), corners.tolist(), d[:, 4].tolist(), d[:, 5].tolist())]

    def label_rows(self, det: torch.Tensor, polygons: list[np.ndarray] | None, shape: tuple[int, int],
                   with_conf: bool) -> str:
        return dota_rows(det, shape, with_conf)

    def save_val_batch(self, out_dir: Path, index: int, batch: Batch, targets: torch.Tensor, dets: list[torch.Tensor],
                       names: list[str], overlap: bool, protos: torch.Tensor | None) -> None:
        h, w = batch.imgs.shape[-2:]
        cv2.imwrite(str(out_dir / f"val_batch{index}_labels.jpg"), draw_rotated_batch(batch.imgs, targets, names))
        scale = torch.tensor([w, h, w, h], dtype=torch.float64)
        rows = []
        for i, det in enumerate(dets):
            det = det[det[:, 4] >= PLOT_CONF].detach().double().cpu()
            rows.append(torch.cat((torch.full((len(det), 1), float(i), dtype=torch.float64), det[:, 5:6],
                                   det[:, :4] / scale, det[:, 6:7], det[:, 4:5]), 1))
        cv2.imwrite(str(out_dir / f"val_batch{index}_pred.jpg"), draw_rotated_batch(batch.imgs, torch.cat(rows), names))

    def result_boxes(self, det_native: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The rotated boxes' axis-aligned bounds, and their xywhr."""
        rotated = rotated_columns(det_native)
        corners = xywhr_to_corners(rotated)
        return torch.cat((corners.amin(1), corners.amax(1)), 1), rotated

    def result_fields(self, proto: torch.Tensor | None, det: torch.Tensor, boxes: torch.Tensor,
                      input_hw: tuple[int, int], gain: tuple[float, float], pad: tuple[float, float],
                      original_hw: tuple[int, int], retina_masks: bool) -> dict[str, Any]:
        """No masks; the outlines (``polygons``) are the rotated boxes' corners in the original image."""
        corners = xywhr_to_corners(rotated_columns(self.original_boxes(det, gain, pad, original_hw)))
        return {"polygons": list(corners.float().cpu().numpy())}
