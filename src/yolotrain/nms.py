"""Post-processing of decoded detector output: score filter, class-aware NMS, and mapping boxes from
the letterboxed network input back to original image pixels.

Semantics follow the reference ``non_max_suppression``: candidates must have objectness above
``conf`` before the class score (objectness × class probability) is formed and filtered again, at
most ``max_nms`` boxes (highest scores) enter NMS, and at most ``max_det`` leave it per image.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torchvision.ops import nms

from .boxes import xywh_to_xyxy
from .family import ModelFamily
from .messages import brief
from .rotated import probiou
from .settings import setting

# Boxes entering NMS per image at most: beyond this NMS time grows quadratically for no gain.
MAX_NMS = 30000
# Per-class coordinate shift for class-aware NMS: larger than any box side in pixels.
MAX_WH = 7680
# Candidates of one image above which one NMS per class beats one NMS on all classes: measured on coco128
# at val's thresholds on a 2-core x86 CPU (per-class: 0.5x the time at 5000 candidates, 1.5x at 1000,
# where its per-class calls cost more than they save).
PER_CLASS_NMS_FROM = 3000
# Rows of the rotated NMS's overlap matrix taken at once: a few hundred MB of temporaries at MAX_NMS candidates.
ROTATED_NMS_BLOCK = 256


def check_nms_limits(max_det: int, classes: Sequence[int] | None = None, num_classes: int | None = None) -> None:
    """``max_det`` and the ``classes`` filter, checked once before any image is read (one-line errors).

    More than :data:`MAX_NMS` detections per image cannot come out of NMS (no more go in), and a class
    id the model does not predict would silently filter every detection away.
    """
    if isinstance(max_det, bool) or not isinstance(max_det, int) or not 1 <= max_det <= MAX_NMS:
        raise ValueError(f"max_det (--max-det) must be an integer from 1 to {MAX_NMS}, got {brief(max_det)}")
    if classes is None:
        return
    try:
        ids = [operator.index(c) for c in classes]
    except TypeError:
        raise ValueError(f"classes (--classes) must be class ids, got {brief(classes)}") from None
    outside = [c for c in ids if c < 0 or (num_classes is not None and c >= num_classes)]
    if not ids or outside:
        known = f"0..{num_classes - 1}" if num_classes is not None else "0 or more"
        raise ValueError(f"classes (--classes) {brief(outside or ids)}: this model's class ids are {known}")


def _check_thresholds(conf: float, iou: float | None) -> None:
    if not 0.0 <= conf <= 1.0:
        raise ValueError(f"conf must be in [0, 1], got {conf}")
    if iou is not None and not 0.0 <= iou <= 1.0:
        raise ValueError(f"iou must be in [0, 1], got {iou}")


@dataclass(frozen=True)
class NMSConfig:
    """What detections leave NMS; the defaults are the reference's for prediction (``detect.py``),
    :data:`VAL_NMS` its mAP settings (``val.py``). Checked by :func:`check_nms_limits`: ``max_det`` here,
    ``classes`` once the model's class count is known."""

    conf: float = setting(0.25, "confidence threshold", flags=("--conf", "--conf-thres"))
    iou: float | None = setting(None, "NMS IoU threshold (default: the model family's: YOLOv5's 0.45 to predict and "
                                "0.6 to validate, 0.7 for anchor-free models)", flags=("--iou", "--iou-thres"))
    max_det: int = setting(1000, f"detections kept per image (1 to {MAX_NMS})")
    classes: tuple[int, ...] | None = setting(None, "keep only these class ids")
    agnostic: bool = setting(False, "suppress across classes", flags=("--agnostic-nms",))

    def __post_init__(self) -> None:
        _check_thresholds(self.conf, self.iou)
        check_nms_limits(self.max_det)


# The reference's mAP settings (its val.py): a low threshold so the precision-recall curve is complete; the IoU
# threshold the model family's (yolotrain.family.nms_iou).
VAL_NMS = NMSConfig(conf=0.001, max_det=300)


def _candidates(x: torch.Tensor, conf: float, multi_label: bool, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of one image ``[n, 5+nc(+extra)]`` (objectness already above ``conf``) → ``[m, 6]`` (xyxy, score,
    class) whose score = objectness × class probability exceeds ``conf``, and the row each came from."""
    boxes = xywh_to_xyxy(x[:, :4])
    scores = x[:, 5:5 + num_classes] * x[:, 4:5]
    if multi_label:
        # Every (box, class) pair above the threshold is its own candidate.
        box_i, cls_j = (scores > conf).nonzero(as_tuple=True)
        return torch.cat((boxes[box_i], scores[box_i, cls_j, None], cls_j[:, None].to(x.dtype)), 1), box_i
    best, cls_j = scores.max(1, keepdim=True)
    keep = (best.view(-1) > conf).nonzero().view(-1)
    return torch.cat((boxes[keep], best[keep], cls_j[keep].to(x.dtype)), 1), keep


def _class_aware_nms(det: torch.Tensor, iou: float, agnostic: bool,
                     per_class_from: int = PER_CLASS_NMS_FROM) -> torch.Tensor:
    """Rows of ``det`` (``[n, 6+]``: xyxy, score, class; sorted by score, highest first) that survive NMS,
    as ascending row indices: the order of the reference's one call on all classes.

    The reference shifts each class's boxes by class × :data:`MAX_WH` so that classes never overlap, then
    runs one NMS, whose cost grows with kept boxes × candidates. Above ``per_class_from``
    candidates each class runs its own NMS here, on the same shifted coordinates: the same float32
    rounding, hence the same IoUs and the same kept boxes. torchvision's NMS visits boxes in a stable
    score order, so with ``det`` sorted its kept rows come out in ascending row order, and so do the
    classes' kept rows merged and sorted.
    """
    offsets = det[:, 5:6] * (0 if agnostic else MAX_WH)
    boxes, scores = det[:, :4] + offsets, det[:, 4]
    if agnostic or len(det) <= per_class_from:
        return nms(boxes, scores, iou)
    rows_by_class = det[:, 5].argsort(stable=True)  # each class's rows, still in score order
    counts = torch.unique_consecutive(det[rows_by_class, 5], return_counts=True)[1]
    kept = [rows[nms(boxes[rows], scores[rows], iou)] for rows in rows_by_class.split(counts.tolist())]
    return torch.cat(kept).sort().values


def non_max_suppression(
    prediction: torch.Tensor,
    conf: float = NMSConfig.conf,
    iou: float = ModelFamily.predict_iou,
    classes: Sequence[int] | None = None,
    agnostic: bool = False,
    multi_label: bool = False,
    max_det: int = VAL_NMS.max_det,
    max_nms: int = MAX_NMS,
    num_extra: int = 0,
) -> list[torch.Tensor]:
    """Filter and suppress decoded detections.

    Args:
        prediction: ``[B, N, 5+nc]`` from ``Yolov5.eval()``: cx, cy, w, h (pixels), objectness, class
            probabilities.
        conf: minimum objectness and minimum final score (exclusive, as in the reference).
        iou: boxes overlapping a higher-scoring box of the same class by more than this are dropped.
        classes: keep only these class ids.
        agnostic: suppress across classes (one box per location whatever its class).
        multi_label: a box may be kept once per class whose score passes ``conf`` (used for mAP);
            otherwise only its best class is considered. Has no effect for one class.
        max_det: detections kept per image.
        max_nms: candidates entering NMS per image (the highest scores).
        num_extra: trailing columns that are not class scores (a segmentation model's mask
            coefficients); each detection carries its box's values of them, unchanged.

    Returns:
        One ``[n, 6+num_extra]`` tensor per image: x1, y1, x2, y2 (input pixels), score, class, then the
        extra columns; sorted by score.
    """
    _check_thresholds(conf, iou)
    if prediction.ndim != 3 or prediction.shape[2] < 6 + num_extra:
        raise ValueError(f"expected decoded predictions [B, N, 5+nc{'+nm' if num_extra else ''}], "
                         f"got shape {tuple(prediction.shape)}")
    multi_label = multi_label and prediction.shape[2] - num_extra > 6
    class_filter = None if classes is None else torch.as_tensor(list(classes), device=prediction.device)
    keep_obj = prediction[..., 4] > conf
    output = []
    num_classes = prediction.shape[2] - 5 - num_extra
    for x, keep in zip(prediction, keep_obj):
        x = x[keep]
        det, source = _candidates(x, conf, multi_label, num_classes)
        if class_filter is not None:
            wanted = torch.isin(det[:, 5].long(), class_filter)
            det, source = det[wanted], source[wanted]
        order = det[:, 4].argsort(descending=True)[:max_nms]
        det, source = det[order], source[order]
        kept = _class_aware_nms(det, iou, agnostic)[:max_det]
        det = det[kept]
        if num_extra:  # the extra columns of the kept detections only, taken from the rows they came from
            det = torch.cat((det, x[source[kept], 5 + num_classes:]), 1)
        output.append(det)
    return output


def _fast_rotated_nms(boxes: torch.Tensor, iou: float) -> torch.Tensor:
    """Rows of ``boxes`` (``[n, 5]`` xywhr, sorted by score, highest first) that no higher-scoring box overlaps
    by more than ``iou`` (ProbIoU), ascending: Fast NMS (Bolya et al., 2019), as the reference's rotated NMS,
    where a box that is itself suppressed still suppresses the boxes below it.

    The reference builds the whole ``[n, n]`` ProbIoU matrix (gigabytes, times its temporaries, at
    :data:`MAX_NMS` candidates); the same overlaps are taken here :data:`ROTATED_NMS_BLOCK` suppressing rows at a time.
    """
    n = boxes.shape[0]
    suppressed = torch.zeros(n, dtype=torch.bool, device=boxes.device)
    columns = torch.arange(n, device=boxes.device)
    for start in range(0, n, ROTATED_NMS_BLOCK):
        rows = columns[start:start + ROTATED_NMS_BLOCK, None]
        above = probiou(boxes[start:start + ROTATED_NMS_BLOCK], boxes) > iou
        suppressed = suppressed | (above & (columns[None] > rows)).any(0)
    return (~suppressed).nonzero().view(-1)


def rotated_non_max_suppression(
    prediction: torch.Tensor,
    conf: float = NMSConfig.conf,
    iou: float = NMSConfig.iou,
    classes: Sequence[int] | None = None,
    agnostic: bool = False,
    multi_label: bool = False,
    max_det: int = VAL_NMS.max_det,
    max_nms: int = MAX_NMS,
) -> list[torch.Tensor]:
    """Filter and suppress decoded rotated detections, as :func:`non_max_suppression` with ProbIoU.

    Args:
        prediction: ``[B, N, 5+nc+1]`` from an OBB model in eval mode: cx, cy, w, h (pixels), objectness,
            class probabilities, angle (radians).
        conf, iou, classes, agnostic, multi_label, max_det, max_nms: as in :func:`non_max_suppression`;
            the overlap is ProbIoU and every candidate's suppressors are all higher-scoring candidates of its
            class (Fast NMS, the reference's rotated rule): its time grows with the square of each class's
            candidates (of all of them with ``agnostic``), which ``max_nms`` bounds.

    Returns:
        One ``[n, 7]`` tensor per image: cx, cy, w, h (input pixels), score, class, angle; sorted by score.
    """
    _check_thresholds(conf, iou)
    if prediction.ndim != 3 or prediction.shape[2] < 7:
        raise ValueError(f"expected decoded rotated predictions [B, N, 5+nc+1], got shape {tuple(prediction.shape)}")
    num_classes = prediction.shape[2] - 6
    multi_label = multi_label and num_classes > 1
    class_filter = None if classes is None else torch.as_tensor(list(classes), device=prediction.device)
    output = []
    for x in prediction:
        x = x[x[:, 4] > conf]
        scored, source = _candidates(x, conf, multi_label, num_classes)
        if class_filter is not None:
            wanted = torch.isin(scored[:, 5].long(), class_filter)
            scored, source = scored[wanted], source[wanted]
        order = scored[:, 4].argsort(descending=True)[:max_nms]
        # The candidates' own xywhr (not _candidates' xyxy), with their scores and classes.
        det = torch.cat((x[source[order], :4], scored[order, 4:6], x[source[order], -1:]), 1)
        xywhr = det[:, [0, 1, 2, 3, 6]]
        if agnostic:
            kept = _fast_rotated_nms(xywhr, iou)
        else:
            # Class by class: the reference shifts the classes far apart in one matrix, where boxes of two classes
            # never overlap, so the same boxes are kept while the overlaps taken shrink from the square of all the
            # candidates (up to MAX_NMS, minutes on a CPU when a fresh model's scores of many classes pass the
            # threshold) to the sum of each class's square.
            rows = [(det[:, 5] == c).nonzero().view(-1) for c in det[:, 5].unique()]
            kept = torch.cat([r[_fast_rotated_nms(xywhr[r], iou)] for r in rows] or [order[:0]]).sort().values
        output.append(det[kept[:max_det]])
    return output


def scale_boxes_to_original(
    boxes: torch.Tensor, gain: tuple[float, float], pad: tuple[float, float], original_hw: tuple[int, int]
) -> torch.Tensor:
    """Map xyxy boxes from the letterboxed input back to the original image and clip them to it.

    ``gain`` is (x, y) scale from original to input pixels and ``pad`` the (left, top) border, so
    ``x_input = x_original * gain + pad``. Returns a new tensor.
    """
    offset = boxes.new_tensor((pad[0], pad[1], pad[0], pad[1]))
    scale = boxes.new_tensor((gain[0], gain[1], gain[0], gain[1]))
    h, w = original_hw
    upper = boxes.new_tensor((w, h, w, h))
    return ((boxes[..., :4] - offset) / scale).clamp(min=0).minimum(upper)
