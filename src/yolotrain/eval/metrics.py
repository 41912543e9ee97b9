"""Detection metrics: matching detections to labels, precision / recall / AP per class, the
confusion matrix, and the :class:`Metrics` summary with its table.

The matching rule, the 101-point interpolated AP and the choice of the reported P and R (at the
confidence that maximises the smoothed mean F1) follow the reference ``val.py`` /
``utils/metrics.py`` so numbers are comparable with published YOLOv5 results; :data:`ULTRALYTICS_SCORING`
gives Ultralytics 8.4's instead, which its anchor-free models are published with (see :class:`ScoringRules`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torchvision.ops import box_iou

from .masks import mask_iou

# mAP50-95 averages AP over these IoU thresholds (float32, exactly as the reference builds them).
IOU_THRESHOLDS = torch.linspace(0.5, 0.95, 10)
# Points on the confidence axis where precision / recall / F1 curves are sampled.
CURVE_POINTS = 1000
_EPS = 1e-16
# The 101 recall points of interpolated AP and their spacings (made once: AP is taken per class and threshold).
_AP_RECALLS = np.linspace(0, 1, 101)
_AP_RECALL_STEPS = np.diff(_AP_RECALLS)


@dataclass(frozen=True)
class ScoringRules:
    """Where YOLOv5's val (the defaults) and Ultralytics 8.4's score the same detections differently.

    ``greedy_matching``: detections, in descending score order, each take the same-class label they overlap
    most among those no higher-scoring detection took, per IoU threshold (8.4's ``match_predictions``); YOLOv5's
    rule pairs each detection with its best label only, and loses it when that label is taken.
    ``drop_at_last_recall``: the precision envelope falls to 0 at the highest recall reached (8.4's
    ``compute_ap``); YOLOv5's joins that point to (recall 1, precision 0) by a line, which adds area whenever
    recall stays below 1. ``input_pixels``: boxes are compared in the network input's pixels as the model gave
    them (8.4 compares them there, unclipped); YOLOv5's in the original image's, clipped to it.
    """

    greedy_matching: bool = False
    drop_at_last_recall: bool = False
    input_pixels: bool = False


YOLOV5_SCORING = ScoringRules()
ULTRALYTICS_SCORING = ScoringRules(greedy_matching=True, drop_at_last_recall=True, input_pixels=True)
# The rules by the name a model family gives (:attr:`yolotrain.family.ModelFamily.scoring`).
SCORING_RULES = {"yolov5": YOLOV5_SCORING, "ultralytics": ULTRALYTICS_SCORING}


def match_predictions(det_boxes: torch.Tensor, det_cls: torch.Tensor, gt_boxes: torch.Tensor,
                      gt_cls: torch.Tensor, iou_thresholds: torch.Tensor = IOU_THRESHOLDS,
                      greedy: bool = False) -> torch.Tensor:
    """Which detections are true positives at each IoU threshold: ``[n_det, n_thresholds]`` bool.

    Detections must be sorted by descending score. Reference rule: each detection is paired with
    the same-class label it overlaps most; a pair counts at threshold t when that IoU >= t, and a
    label claimed by several detections goes to the first (highest-scoring) of them. ``greedy``: the
    rule of :attr:`ScoringRules.greedy_matching`.
    """
    if det_boxes.shape[0] == 0 or gt_boxes.shape[0] == 0:
        return torch.zeros((det_boxes.shape[0], iou_thresholds.numel()), dtype=torch.bool, device=det_boxes.device)
    return match_by_iou(box_iou(gt_boxes, det_boxes), det_cls, gt_cls, iou_thresholds, greedy)


def match_by_iou(iou: torch.Tensor, det_cls: torch.Tensor, gt_cls: torch.Tensor,
                 iou_thresholds: torch.Tensor = IOU_THRESHOLDS, greedy: bool = False) -> torch.Tensor:
    """:func:`match_predictions` on a given ``[n_labels, n_det]`` IoU matrix (of boxes, or of masks)."""
    m, n, t = iou.shape[0], iou.shape[1], iou_thresholds.numel()
    if n == 0 or m == 0:
        return torch.zeros((n, t), dtype=torch.bool, device=iou.device)
    iou = iou * (gt_cls[:, None] == det_cls[None, :])
    if greedy:
        return _match_greedily(iou, iou_thresholds.to(iou))
    best_iou, best_gt = iou.max(0)
    valid = best_iou[:, None] >= iou_thresholds.to(best_iou)[None, :]
    det_index = torch.arange(n, device=iou.device)[:, None].expand(n, t)
    claimant = torch.where(valid, det_index, n)
    owner_index = best_gt[:, None].expand(n, t)
    first = torch.full((m, t), n, device=iou.device).scatter_reduce(0, owner_index, claimant, reduce="amin")
    return valid & (first.gather(0, owner_index) == det_index)


def _match_greedily(iou: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """:attr:`ScoringRules.greedy_matching` on a class-masked ``[n_labels, n_det]`` IoU matrix: each detection in
    turn (a sequence by nature) takes, at every threshold, the best label still free there."""
    n, t = iou.shape[1], thresholds.numel()
    correct = torch.zeros((n, t), dtype=torch.bool, device=iou.device)
    taken = torch.zeros((iou.shape[0], t), dtype=torch.bool, device=iou.device)
    columns = torch.arange(t, device=iou.device)
    for j in (iou >= thresholds.min()).any(0).nonzero().view(-1).tolist():
        free_iou = torch.where(taken, 0.0, iou[:, j, None])
        best = free_iou.argmax(0)  # the first of equal IoUs, as numpy's argmax in the reference
        correct[j] = free_iou[best, columns] >= thresholds
        taken[best, columns] |= correct[j]
    return correct


def labelled_class_detections(det_cls: torch.Tensor, gt_cls: torch.Tensor) -> torch.Tensor:
    """Which detections (bool ``[n]``) are of a class among the labels: the only ones :func:`match_by_iou`
    can pair, since an IoU with a label of another class counts as 0."""
    return torch.isin(det_cls, gt_cls.to(det_cls))


def interpolated_ap(recall: np.ndarray, precision: np.ndarray,
                    drop_at_last_recall: bool = False) -> tuple[float, np.ndarray, np.ndarray]:
    """COCO-style 101-point interpolated average precision of one PR curve.

    Returns ``(ap, envelope precision, recall)`` with sentinels (0 recall, precision 1; recall 1,
    precision 0) added; the precision envelope is the running maximum from the right. With
    ``drop_at_last_recall`` a point of precision 0 at the last recall comes before the end sentinel
    (:attr:`ScoringRules.drop_at_last_recall`).
    """
    last = [recall[-1] if len(recall) else 1.0] if drop_at_last_recall else []
    mrec = np.concatenate(([0.0], recall, last, [1.0]))
    mpre = np.flip(np.maximum.accumulate(np.flip(np.concatenate(([1.0], precision, [0.0] * len(last), [0.0])))))
    y = np.interp(_AP_RECALLS, mrec, mpre)
    ap = float(((y[1:] + y[:-1]) / 2 * _AP_RECALL_STEPS).sum())  # trapezoid rule
    return ap, mpre, mrec


def _smooth(y: np.ndarray, fraction: float) -> np.ndarray:
    """Box filter over ``fraction`` of the points, edges padded with the end values."""
    nf = round(len(y) * fraction * 2) // 2 + 1  # odd window
    pad = np.ones(nf // 2)
    padded = np.concatenate((pad * y[0], y, pad * y[-1]))
    return np.convolve(padded, np.ones(nf) / nf, mode="valid")


@dataclass
class Curves:
    """Per-class curves over the confidence axis ``px`` (0..1) and PR curves at IoU 0.5."""

    px: np.ndarray
    precision: np.ndarray  # [k, CURVE_POINTS]
    recall: np.ndarray
    f1: np.ndarray
    pr: np.ndarray  # [k, CURVE_POINTS] precision at recall px, IoU 0.5


@dataclass
class ClassResults:
    """Results for the classes that have labels (``classes``), in ascending class order."""

    classes: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    f1: np.ndarray
    ap: np.ndarray  # [k, n_thresholds]
    curves: Curves


def ap_per_class(tp: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray, target_cls: np.ndarray,
                 drop_at_last_recall: bool = False) -> ClassResults:
    """Precision, recall and AP of every class that has labels.

    Args:
        tp: ``[n, T]`` true-positive flags of all detections at each IoU threshold.
        conf: ``[n]`` detection scores.
        pred_cls: ``[n]`` detection classes.
        target_cls: ``[m]`` classes of all labels.
        drop_at_last_recall: how each PR curve ends (:attr:`ScoringRules.drop_at_last_recall`).

    P and R are read at the single confidence maximising the (smoothed) mean F1 over classes.
    """
    order = np.argsort(-conf, kind="stable")
    tp, conf, pred_cls = tp[order], conf[order], pred_cls[order]
    classes, n_labels = np.unique(target_cls, return_counts=True)
    k, t = classes.shape[0], tp.shape[1]
    px = np.linspace(0, 1, CURVE_POINTS)
    ap = np.zeros((k, t))
    p_curve, r_curve, pr_curve = np.zeros((k, CURVE_POINTS)), np.zeros((k, CURVE_POINTS)), np.zeros((k, CURVE_POINTS))
    for ci, c in enumerate(classes):
        mine = pred_cls == c
        if not mine.any():
            continue
        tpc = tp[mine].cumsum(0)
        fpc = (1 - tp[mine]).cumsum(0)
        recall = tpc / (n_labels[ci] + _EPS)
        precision = tpc / (tpc + fpc)
        # Confidence decreases along the detections, so interpolate on the negated axis.
        r_curve[ci] = np.interp(-px, -conf[mine], recall[:, 0], left=0)
        p_curve[ci] = np.interp(-px, -conf[mine], precision[:, 0], left=1)
        for j in range(t):
            ap[ci, j], mpre, mrec = interpolated_ap(recall[:, j], precision[:, j], drop_at_last_recall)
            if j == 0:
                pr_curve[ci] = np.interp(px, mrec, mpre)
    f1_curve = 2 * p_curve * r_curve / (p_curve + r_curve + _EPS)
    best = int(_smooth(f1_curve.mean(0), 0.1).argmax()) if k else 0
    return ClassResults(classes.astype(int), p_curve[:, best], r_curve[:, best], f1_curve[:, best], ap,
                        Curves(px, p_curve, r_curve, f1_curve, pr_curve))


class ConfusionMatrix:
    """Counts of (predicted class, true class) at a fixed score and IoU; index ``nc`` is background.

    Rows are predictions, columns are labels. A label matched by no detection counts as predicted
    background; a detection matching no label counts as a background false positive (also on
    images without labels, which the reference leaves out).
    """

    def __init__(self, nc: int, conf: float = 0.25, iou: float = 0.45) -> None:
        self.nc = nc
        self.conf = conf
        self.iou = iou
        self.matrix = np.zeros((nc + 1, nc + 1), dtype=np.int64)

    def update(self, detections: torch.Tensor, gt_boxes: torch.Tensor, gt_cls: torch.Tensor) -> None:
        """Add one image: ``detections [n, 6]`` (xyxy, score, class), labels ``[m, 4]`` xyxy and ``[m]``."""
        det = detections[detections[:, 4] > self.conf]
        det_cls, gt_cls = det[:, 5].long().cpu(), gt_cls.long().cpu()
        n, m = det.shape[0], gt_boxes.shape[0]
        matched_det = torch.zeros(n, dtype=torch.bool)
        pred_of_label = torch.full((m,), self.nc, dtype=torch.long)
        if n and m:
            iou = box_iou(gt_boxes, det[:, :4]).cpu()
            best_iou, best_gt = iou.max(0)
            ok = best_iou > self.iou
            # Each label keeps the detection that overlaps it most among those that chose it.
            claims = torch.zeros(m, n)
            claims[best_gt[ok], torch.nonzero(ok).view(-1)] = best_iou[ok]
            win_iou, win_det = claims.max(1)
            has = win_iou > 0
            pred_of_label[has] = det_cls[win_det[has]]
            matched_det[win_det[has]] = True
        rows = torch.cat((pred_of_label, det_cls[~matched_det]))
        cols = torch.cat((gt_cls, torch.full((int((~matched_det).sum()),), self.nc, dtype=torch.long)))
        size = self.nc + 1
        self.matrix += torch.bincount(rows * size + cols, minlength=size * size).view(size, size).numpy()


@dataclass
class Metrics:
    """Validation results. Per-class arrays are indexed like ``classes`` (classes that have labels)."""

    names: list[str]
    images: int
    instances: np.ndarray  # labels per class id, length nc
    classes: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    ap50: np.ndarray
    ap: np.ndarray  # mean over IoU 0.5:0.95 per class
    speed: dict[str, float] = field(default_factory=dict)  # milliseconds per image
    loss: dict[str, float] | None = None
    curves: Curves | None = None
    confusion: ConfusionMatrix | None = None
    coco: list[float] | None = None  # the 12 COCO summary numbers when --save-json evaluated them
    masks: Metrics | None = None  # a segmentation model's mask results (same images and labels)
    keypoints: Metrics | None = None  # a pose model's keypoint results, matched by OKS (same images and labels)

    @property
    def mp(self) -> float:
        """Mean precision over classes with labels."""
        return float(self.precision.mean()) if self.precision.size else 0.0

    @property
    def mr(self) -> float:
        """Mean recall over classes with labels."""
        return float(self.recall.mean()) if self.recall.size else 0.0

    @property
    def map50(self) -> float:
        return float(self.ap50.mean()) if self.ap50.size else 0.0

    @property
    def map(self) -> float:
        """mAP50-95."""
        return float(self.ap.mean()) if self.ap.size else 0.0

    def _parts(self) -> list[tuple[str, Metrics]]:
        """The results beside the boxes' (masks, keypoints) that this model has, with their table labels."""
        return [(label, part) for label, part in (("Mask", self.masks), ("Pose", self.keypoints)) if part is not None]

    def fitness(self) -> float:
        """The reference's model-selection score: 0.1 mAP50 + 0.9 mAP50-95, of the boxes plus (for a
        segmentation or pose model) the same of the masks or keypoints."""
        box = 0.1 * self.map50 + 0.9 * self.map
        return box + sum(part.fitness() for _, part in self._parts())

    def _row_values(self, index: int | None) -> list[float]:
        """P, R, mAP50, mAP50-95 overall (``index`` None) or of the ``index``-th class with labels; zeros
        for a class these results have none of (masks without a single true positive)."""
        if index is None:
            return [self.mp, self.mr, self.map50, self.map]
        if index >= self.classes.size:
            return [0.0] * 4
        return [float(self.precision[index]), float(self.recall[index]), float(self.ap50[index]),
                float(self.ap[index])]

    def class_maps(self) -> np.ndarray:
        """mAP50-95 per class id (length nc); classes without labels get the overall mAP."""
        out = np.full(len(self.names), self.map)
        out[self.classes] = self.ap
        return out

    def table(self, per_class: bool = True) -> str:
        """The familiar results table: header, the ``all`` row, then one row per class with labels."""
        columns = ["P", "R", "mAP50", "mAP50-95"]
        if self._parts():  # the reference's segmentation and pose headers
            columns = [f"{label}(P" if i == 0 else f"{column})" if i == 3 else column
                       for label in ["Box", *(label for label, _ in self._parts())]
                       for i, column in enumerate(columns)]
        head = f"{'Class':>22}" + "".join(f"{h:>11}" for h in ["Images", "Instances", *columns])
        parts = [self, *(part for _, part in self._parts())]

        def row(name: str, n: int, index: int | None) -> str:
            values = [v for part in parts for v in part._row_values(index)]
            return f"{name:>22}{self.images:>11}{n:>11}" + "".join(f"{v:>11.3g}" for v in values)

        lines = [head, row("all", int(self.instances.sum()), None)]
        if per_class and len(self.names) > 1:
            lines += [row(self.names[c], int(self.instances[c]), i) for i, c in enumerate(self.classes)]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, float]:
        """Flat summary for logs and checkpoints."""
        out = {"precision": self.mp, "recall": self.mr, "mAP50": self.map50, "mAP50-95": self.map}
        for label, part in self._parts():
            out.update({f"{label.lower()}_{k}": v for k, v in part.as_dict().items()})
        out.update({f"val/{k}_loss": v for k, v in (self.loss or {}).items()})
        out.update({f"speed/{k}_ms": v for k, v in self.speed.items()})
        return out


class DetectionStats:
    """Accumulates per-image matches over a validation pass and turns them into :class:`Metrics`, by ``rules``
    (the matching and the PR curves' end; the caller gives boxes in the pixels they name)."""

    def __init__(self, nc: int, iou_thresholds: torch.Tensor = IOU_THRESHOLDS,
                 rules: ScoringRules = YOLOV5_SCORING) -> None:
        self.nc = nc
        self.rules = rules
        self.iou_thresholds = iou_thresholds
        self.images = 0
        self._tp: list[torch.Tensor] = []
        self._conf: list[torch.Tensor] = []
        self._pred_cls: list[torch.Tensor] = []
        self._target_cls: list[torch.Tensor] = []

    def update(self, detections: torch.Tensor, gt_boxes: torch.Tensor, gt_cls: torch.Tensor) -> None:
        """Add one image: ``detections [n, 6]`` sorted by score and labels, both in the same pixel space."""
        tp = match_predictions(detections[:, :4], detections[:, 5], gt_boxes, gt_cls,
                               self.iou_thresholds.to(detections.device), self.rules.greedy_matching)
        self._add(tp, detections, gt_cls)

    def _add(self, tp: torch.Tensor, detections: torch.Tensor, gt_cls: torch.Tensor) -> None:
        """One image's true-positive flags ``[n, T]``, its detections' scores (column 4) and classes (column 5),
        and its labels' classes."""
        self.images += 1
        self._tp.append(tp.cpu())
        self._conf.append(detections[:, 4].cpu())
        self._pred_cls.append(detections[:, 5].cpu())
        self._target_cls.append(gt_cls.cpu().to(detections.dtype))

    def compute(self, names: list[str]) -> Metrics:
        """Metrics over everything added so far."""
        return self._metrics(self._tp, names)

    def _metrics(self, tp_parts: list[torch.Tensor], names: list[str]) -> Metrics:
        t = self.iou_thresholds.numel()
        tp = torch.cat(tp_parts).numpy() if tp_parts else np.zeros((0, t), bool)
        conf = torch.cat(self._conf).numpy() if self._conf else np.zeros(0)
        pred_cls = torch.cat(self._pred_cls).numpy() if self._pred_cls else np.zeros(0)
        target_cls = torch.cat(self._target_cls).numpy() if self._target_cls else np.zeros(0)
        instances = np.bincount(target_cls.astype(int), minlength=self.nc)
        empty = np.zeros(0)
        if not tp.any():  # no true positive at all: every metric is zero, as in the reference
            return Metrics(names, self.images, instances, empty.astype(int), empty, empty, empty, empty)
        res = ap_per_class(tp.astype(np.float64), conf, pred_cls, target_cls, self.rules.drop_at_last_recall)
        return Metrics(names, self.images, instances, res.classes, res.precision, res.recall, res.ap[:, 0],
                       res.ap.mean(1), curves=res.curves)


class SegmentationStats(DetectionStats):
    """:class:`DetectionStats` of boxes plus the same matching and AP over mask IoUs; ``compute`` gives
    the box :class:`Metrics` with the mask ones in its ``masks``."""

    def __init__(self, nc: int, iou_thresholds: torch.Tensor = IOU_THRESHOLDS,
                 rules: ScoringRules = YOLOV5_SCORING) -> None:
        super().__init__(nc, iou_thresholds, rules)
        self._mask_tp: list[torch.Tensor] = []

    def update_masks(self, detections: torch.Tensor, gt_boxes: torch.Tensor, gt_cls: torch.Tensor,
                     pred_masks: torch.Tensor, gt_masks: torch.Tensor, masked: torch.Tensor | None = None) -> None:
        """Add one image: as :meth:`DetectionStats.update`, with the detections' and labels' binary masks
        (``[n, h, w]``, ``[m, h, w]``, one resolution); with ``masked`` (bool ``[n]``, a superset of
        :func:`labelled_class_detections`) ``pred_masks`` are those detections' only: the others' IoUs
        would count for nothing."""
        self.update(detections, gt_boxes, gt_cls)
        if masked is None:
            iou = mask_iou(gt_masks, pred_masks)
        else:
            iou = gt_masks.new_zeros((gt_masks.shape[0], detections.shape[0]), dtype=torch.float32)
            iou[:, masked] = mask_iou(gt_masks, pred_masks)
        tp = match_by_iou(iou, detections[:, 5], gt_cls.to(detections.device),
                          self.iou_thresholds.to(detections.device), self.rules.greedy_matching)
        self._mask_tp.append(tp.cpu())

    def compute(self, names: list[str]) -> Metrics:
        metrics = self._metrics(self._tp, names)
        metrics.masks = self._metrics(self._mask_tp, names)
        return metrics
