"""Segmentation's answers to evaluation and prediction, where they differ from detection's: its models return
prototype masks with their boxes, so val scores the masks too (at the prototypes' resolution, against the labels'
polygons drawn there), writes them as COCO RLEs and polygon label rows, and predict's results carry them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...data.batch import Batch
from ...data.segment import SegmentBatch
from ...data.sources import img2label_path
from ...eval.coco import coco_evaluate
from ...eval.label_masks import batch_label_masks, read_polygons
from ...eval.masks import (
    masks_in_original,
    masks_to_polygons,
    masks_to_rle,
    polygons_or_boxes,
    process_masks,
    scale_masks_to_original,
    split_overlap_mask,
    upsampled_masks,
)
from ...eval.metrics import Metrics, ScoringRules, SegmentationStats, labelled_class_detections


class SegmentEvaluation:
    """Segmentation's answers to val, predict and inference where a model's masks change them."""


    def augment_refusal(self, name: str) -> str | None:
        return ("--augment is not supported for segmentation models (the reference's loses the prototype masks); "
                f"{name} is one")

    def ensemble_refusal(self, name: str) -> str | None:
        return f"an ensemble (several --weights) merges detection models' boxes: {name} is a segmentation model"

    def tile_grid(self, model: Any) -> int:
        # The tiles' prototypes are stitched into the image's pixel for pixel, so tiles start on whole prototype
        # pixels; on the largest stride, every feature map of a tile samples the image where the whole image's
        # would, so two overlapping tiles' prototypes differ only by what each one's border hides.
        return model.max_stride

    def join_tile_outputs(self, outputs: Sequence[tuple[torch.Tensor, torch.Tensor]], tiles: Any) -> tuple[
            torch.Tensor, torch.Tensor]:
        """``(decoded, proto)`` of the whole images: the tiles' predictions, coefficients and all, moved to the
        image, and ONE prototype map per image stitched from the tiles' (each pixel from the tile whose centre
        is nearest): the output a segmentation model gives for the whole image, so NMS, val's mask scoring,
        the masks of predict's results, their files and drawings take it unchanged.

        Why one stitched map rather than each detection's mask made from its own tile's prototypes: the
        prototypes are the same convolutional features of the same pixels in every tile that holds them (on the
        stride grid, :meth:`tile_grid`), up to what a tile's border hides, which the stitch keeps away from by
        taking each pixel where its tile surrounds it most; the coefficients weight these features the same
        way whichever tile predicted them. So a detection's mask reaches across a tile's border wherever its box
        does (an object cut by one tile's border, kept from the tile that holds it whole, keeps both parts),
        and no mask is bounded by its tile. Per-tile masks would keep every tile's prototypes (tiles x nm x
        H/4 x W/4 on a full-image canvas, or a tile index beside every detection through NMS) and every mask
        path (the prototypes' resolution for mAP, the input's, the original image's, chunked) would need a
        tiled variant; the stitched map costs one crop and copy per tile, the memory of the unsliced model's
        map, and no change downstream."""
        decoded, protos = zip(*outputs)
        return tiles.predictions(decoded), tiles.maps(protos)

    def check_inference(self, model: Any) -> None:
        if model.end_to_end:
            raise ValueError("a segmentation export with NMS inside has no mask coefficients: export it without --nms")

    def infer(self, model: Any, imgs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return model(imgs)

    def nms_extra_columns(self, model: Any) -> int:
        return model.num_masks

    def split_maps(self, maps: Any) -> tuple[Any, torch.Tensor | None]:
        return maps

    def val_loss(self, criterion: Any, maps: Any, protos: torch.Tensor | None, targets: torch.Tensor, batch: Batch,
                 device: torch.device, pred_size: tuple[int, int]) -> None:
        # The segmentation loss scores the masks of the batch too.
        if not isinstance(batch, SegmentBatch):
            raise ValueError("the validation loss of a segmentation model needs batches with masks "
                             "(a segmentation data loader)")
        criterion((maps, protos), targets, batch.masks.to(device), pred_size=pred_size)

    def batch_label_masks(self, batch: Batch, dataset: Any, targets: torch.Tensor) -> list[torch.Tensor] | None:
        return _label_masks(batch, dataset, targets)

    def plot_label_masks(self, batch: Batch) -> torch.Tensor | None:
        return batch.masks if isinstance(batch, SegmentBatch) else None

    def val_stats(self, nc: int, rules: ScoringRules) -> SegmentationStats:
        return SegmentationStats(nc, rules=rules)

    def read_label_masks(self, label_masks: list[torch.Tensor] | None, dataset: Any, first: int, count: int,
                         shape: tuple[int, int], resized: np.ndarray,
                         pads: np.ndarray) -> list[torch.Tensor] | None:
        # A batch without masks (a detection data loader's): they are drawn from the label files' polygons.
        if label_masks is None:
            return batch_label_masks(dataset, first, count, shape, resized, pads)
        return label_masks

    def score_image(self, stats: SegmentationStats, det: torch.Tensor, det_native: torch.Tensor,
                    gt_boxes: torch.Tensor, gt_cls: torch.Tensor, proto: torch.Tensor | None,
                    label_masks: torch.Tensor | None, shape: tuple[int, int]) -> None:
        masked = labelled_class_detections(det[:, 5], gt_cls)
        pred_masks = process_masks(proto, det[:, 6:], det[:, :4], shape, masked)
        gt_masks = _at_size(label_masks.to(pred_masks.device), pred_masks.shape[1:])
        stats.update_masks(det_native, gt_boxes, gt_cls, pred_masks, gt_masks, masked)

    def original_masks(self, proto: torch.Tensor | None, det: torch.Tensor, det_native: torch.Tensor,
                       input_hw: tuple[int, int], pad: np.ndarray, resized: np.ndarray, original_hw: tuple[int, int],
                       rle: bool, polygons: bool) -> tuple[list[dict] | None, list[np.ndarray] | None]:
        return _original_masks(proto, det, det_native, input_hw, pad, resized, original_hw, rle, polygons)

    def label_rows(self, det: torch.Tensor, polygons: list[np.ndarray] | None, shape: tuple[int, int],
                   with_conf: bool) -> str:
        return polygon_rows(det, polygons, shape, with_conf)

    def coco_label_fields(self, dataset: Any) -> dict[str, Any]:
        polygons = getattr(dataset, "segments", None)
        if polygons is None:  # a detection dataset: the polygons are read from its label files
            polygons = [read_polygons(img2label_path(f), labels) for f, labels in zip(dataset.im_files, dataset.labels)]
        return {"polygons": polygons}

    def coco_masks(self, metrics: Metrics, out_dir: Path) -> None:
        if metrics.masks is not None:
            metrics.masks.coco = coco_evaluate(out_dir / "ground_truth.json", out_dir / "predictions.json",
                                               iou_type="segm")

    def result_fields(self, proto: torch.Tensor | None, det: torch.Tensor, boxes: torch.Tensor,
                      input_hw: tuple[int, int], gain: tuple[float, float], pad: tuple[float, float],
                      original_hw: tuple[int, int], retina_masks: bool) -> dict[str, Any]:
        """The detections' bool ``masks`` ``[n, h0, w0]`` of the original image (made there directly with
        ``retina_masks``, else at the network input and resized) and their outlines (``polygons``)."""
        resized = (original_hw[1] * gain[0], original_hw[0] * gain[1])
        if retina_masks:
            chunks = masks_in_original(proto, det[:, 6:], boxes, input_hw, pad, resized, original_hw)
        else:
            chunks = (scale_masks_to_original(m, pad, resized, original_hw)
                      for m in upsampled_masks(proto, det[:, 6:], det[:, :4], input_hw))
        parts = [m.cpu().numpy() for m in chunks]
        masks = np.concatenate(parts) if parts else np.zeros((0, *original_hw), bool)
        return {"masks": masks, "polygons": polygons_or_boxes(masks_to_polygons(masks), boxes)}


def _original_masks(proto: torch.Tensor, det: torch.Tensor, det_native: torch.Tensor, input_hw: tuple[int, int],
                    pad: np.ndarray, resized: np.ndarray, original_hw: tuple[int, int], rle: bool,
                    polygons: bool) -> tuple[list[dict] | None, list[np.ndarray] | None]:
    """The detections' masks at the original image's resolution, as COCO RLEs and/or polygons (original
    pixels), made a chunk of detections at a time."""
    rles: list[dict] = []
    outlines: list[np.ndarray] = []
    for masks in masks_in_original(proto, det[:, 6:], det_native[:, :4], input_hw, tuple(pad), tuple(resized),
                                   original_hw):
        if rle:
            rles += masks_to_rle(masks)
        if polygons:
            outlines += masks_to_polygons(masks)
    return (rles if rle else None), (outlines if polygons else None)



def polygon_rows(det: torch.Tensor, polygons: list[np.ndarray], shape: tuple[int, int], with_conf: bool) -> str:
    """YOLO-seg rows (``class x1 y1 x2 y2 ... [conf]``, normalised to the ``(h, w)`` image) of detections
    and their mask outlines, a row for each: a mask too small for an outline (empty inside its box, one pixel
    or one line) gives its box's corners (:func:`~yolotrain.eval.masks.polygons_or_boxes`)."""
    h, w = shape
    scale = np.array((w, h), np.float64)
    lines = []
    for (score, cls), polygon in zip(det[:, 4:6].double().cpu().tolist(), polygons_or_boxes(polygons, det[:, :4])):
        values = [cls, *(polygon / scale).reshape(-1).tolist()] + ([score] if with_conf else [])
        lines.append(" ".join(f"{v:g}" for v in values) + "\n")
    return "".join(lines)



def _label_masks(batch: Batch, dataset, targets: torch.Tensor) -> list[torch.Tensor] | None:
    """Per image of a :class:`~yolotrain.data.segment.SegmentBatch`, the bool masks of its labels in the order
    of their ``targets`` rows; None for a batch without masks (a detection loader's: read from the label
    files instead). ``masks`` are ``[B, h, w]`` overlap masks (value k + 1: the image's k-th label) when
    the dataset's ``overlap`` is true (the default), else ``[n_targets, h, w]`` in the rows' order."""
    if not isinstance(batch, SegmentBatch):
        return None
    masks, image_of = batch.masks, targets[:, 0].long().cpu()
    counts = torch.bincount(image_of, minlength=batch.imgs.shape[0]).tolist()
    if getattr(dataset, "overlap", True):
        return [split_overlap_mask(masks[i], n) for i, n in enumerate(counts)]
    return list((masks[image_of.argsort(stable=True)] > 0).split(counts))



def _at_size(masks: torch.Tensor, size: torch.Size) -> torch.Tensor:
    """Label masks resized (bilinear, then > 0.5) to the predicted masks' size when they differ, as the
    reference compares them."""
    if masks.shape[1:] == size:
        return masks
    return F.interpolate(masks[None].float(), size, mode="bilinear", align_corners=False)[0] > 0.5
