"""The anchor-free training losses (YOLOv8, YOLO11, YOLOv5u): CIoU and distribution focal loss of the boxes,
class BCE against the task-aligned assigner's soft targets, and for segmentation the mask term.

Semantics follow ultralytics' ``v8DetectionLoss`` and ``v8SegmentationLoss`` (``utils/loss.py``). Every anchor
point of every level predicts, per side, a distribution over ``reg_max`` distances (in strides) from the point to
the box's left, top, right and bottom edges, and one logit per class. :mod:`.assign` picks the points that
answer each target. The box terms (1 - CIoU, and the DFL: cross-entropy against the two bins around the target
distance, weighted by nearness) are weighted by each positive's soft class target; the class BCE is summed over all
points and classes; all three are divided by the sum of the soft targets. The total is
(box + cls + dfl) × batch size, as ultralytics computes it. Like :mod:`.detect`, the loss never writes into its
inputs nor into any tensor autograd saved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..boxes import xywh_to_xyxy, xyxy_to_xywh
from ..settings import from_mapping, setting
from .assign import Assignment, TaskAlignedAssigner, complete_iou_xyxy
from .detect import TargetsLike, YoloLoss, targets_to_tensor
from .segment import _box_pixels, _inside_logits

# Target distances stop this far short of the last bin, so that the bin above the target exists.
LAST_BIN_MARGIN = 0.01
# Anchor points sit at the centres of their cells.
POINT_OFFSET = 0.5


@dataclass(frozen=True)
class AnchorFreeLossConfig:
    """Loss gains and the task-aligned assigner's settings; ultralytics' defaults (``cfg/default.yaml``)."""

    box: float = setting(7.5, "box (CIoU) loss gain", min=0)
    cls: float = setting(0.5, "class loss gain", min=0)
    dfl: float = setting(1.5, "distribution focal loss gain", min=0)
    topk: int = setting(10, "anchor points each target chooses among those inside it (task-aligned assigner)", min=1)
    alpha: float = setting(0.5, "weight of the class score in the assigner's alignment metric (its exponent)", min=0)
    beta: float = setting(6.0, "weight of the box CIoU in the assigner's alignment metric (its exponent)", min=0)


class Predictions:
    """The head maps of a batch flattened over levels, anchor points last-but-one: box distributions
    ``[B, A, 4, reg_max]``, class logits ``[B, A, nc]`` and what follows them as ``coefficients`` (mask coefficients
    ``[B, A, nm]``, or a pose head's keypoints ``[B, A, K*D]``; none for a detector),
    with each point's position ``[A, 2]`` (in strides, cell centres) and stride ``[A, 1]``, and the image size as
    ``pixels`` (width, height, width, height)."""

    def __init__(self, maps: Sequence[torch.Tensor], strides: Sequence[int], reg_max: int, nc: int) -> None:
        batch_size = maps[0].shape[0]
        flat = torch.cat([level.flatten(2) for level in maps], 2).transpose(1, 2)          # [B, A, channels]
        # split, not slices: the gradient of a split is one concatenation, where each slice's would be a zero
        # map of the whole output filled in.
        distributions, self.class_logits, self.coefficients = flat.split(
            (4 * reg_max, nc, flat.shape[-1] - 4 * reg_max - nc), -1)
        self.distributions = distributions.reshape(batch_size, -1, 4, reg_max)
        points, point_strides = [], []
        for level, stride in zip(maps, strides):
            height, width = level.shape[2:]
            ys = torch.arange(height, device=level.device, dtype=level.dtype) + POINT_OFFSET
            xs = torch.arange(width, device=level.device, dtype=level.dtype) + POINT_OFFSET
            grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
            points.append(torch.stack((grid_x, grid_y), -1).reshape(-1, 2))
            point_strides.append(level.new_full((height * width, 1), float(stride)))
        height, width = maps[0].shape[2] * strides[0], maps[0].shape[3] * strides[0]
        self.pixels = torch.tensor([width, height, width, height], dtype=flat.dtype, device=flat.device)
        self.points = torch.cat(points)
        self.strides = torch.cat(point_strides)
        bins = torch.arange(reg_max, device=flat.device, dtype=flat.dtype)
        # Each side's distance (left, top, right, bottom) is the expectation of its distribution; boxes xyxy, in
        # strides.
        self.distances = self.distributions.softmax(-1) @ bins
        self.boxes = torch.cat((self.points - self.distances[..., :2], self.points + self.distances[..., 2:]), -1)


class AnchorFreeLoss:
    """``criterion(outputs, targets, pred_size=imgs.shape[2:4])`` → scalar loss.

    ``outputs`` are the train-mode head maps, one ``[B, 4 * reg_max + nc, H, W]`` per level (box distributions
    first, then class logits). The total is (box + cls + dfl) × batch size; ``self.components`` holds the three
    detached parts. ``rect_training=True`` declares that batches may be non-square (rectangular letterboxed
    batches); without it a non-square batch is refused, as :class:`YoloLoss` refuses it. ``img_size`` is accepted
    as every criterion accepts it; no gain here depends on the image size.
    """

    component_names: tuple[str, ...] = ("box", "cls", "dfl")

    def __init__(self, model: nn.Module, rect_training: bool = False, img_size: int | None = None,
                 hyp: AnchorFreeLossConfig | Mapping[str, float] | None = None) -> None:
        head = getattr(model, "module", model).head  # unwrap DistributedDataParallel
        self.rect_training = rect_training
        self.hyp = hyp if isinstance(hyp, AnchorFreeLossConfig) else from_mapping(AnchorFreeLossConfig, hyp or {})
        self.nc, self.reg_max, self.nm = head.nc, head.reg_max, getattr(head, "nm", 0)
        if self.reg_max < 2:
            raise ValueError(f"the anchor-free loss needs box distributions (reg_max >= 2), not reg_max={self.reg_max}")
        self.strides = tuple(int(s) for s in head.stride.tolist())
        self.nl = len(self.strides)
        # Targets narrower than the second level's stride are widened to it when the assigner looks for points.
        min_side = self.strides[1] if self.nl > 1 else self.strides[0]
        self.assigner = TaskAlignedAssigner(self.nc, topk=self.hyp.topk, alpha=self.hyp.alpha, beta=self.hyp.beta,
                                            min_side=min_side)
        self.components = torch.zeros(len(self.component_names))
        self.step = 0

    def __call__(self, outputs: Sequence[torch.Tensor], targets: TargetsLike,
                 pred_size: Sequence[int] | None = None) -> torch.Tensor:
        maps, targets = self._prepare(outputs, targets, pred_size)
        predictions = Predictions(maps, self.strides, self.reg_max, self.nc)
        padded = padded_targets(targets, maps[0].shape[0], predictions.pixels)
        lbox, lcls, ldfl, _ = self._detection_losses(predictions, padded)
        self.components = torch.stack((lbox, lcls, ldfl)).detach()
        total = (lbox + lcls + ldfl) * maps[0].shape[0]
        if torch.is_grad_enabled():  # a training step; validation only reports its loss
            self._check_diverged(total, maps)
        return total

    # The same divergence check and message as YOLOv5's loss: it reads only the step, the parts and the outputs.
    _check_diverged = YoloLoss._check_diverged
    _image_size = YoloLoss._image_size

    def _prepare(self, outputs: Sequence[torch.Tensor], targets: TargetsLike,
                 pred_size: Sequence[int] | None) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The head maps (checked, in float32 at least) and the targets as an ``[N, 6]`` tensor beside them."""
        self._check_outputs(outputs, pred_size)
        # Half-precision maps (autocast) are scored in float32, as YoloLoss scores them.
        maps = [o.float() if o.dtype in (torch.float16, torch.bfloat16) else o for o in outputs]
        targets = self._targets_tensor(targets, maps[0].device)
        if not torch.isfinite(targets).all():
            raise ValueError("targets contain NaN or infinite values")
        if targets.shape[0]:
            low, high = targets[:, :2].amin(0).tolist(), targets[:, :2].amax(0).tolist()
            if low[0] < 0 or high[0] >= maps[0].shape[0]:
                raise ValueError(f"target image indices must lie in 0..{maps[0].shape[0] - 1} (the batch), "
                                 f"got {low[0]:g}..{high[0]:g}")
            if low[1] < 0 or high[1] >= self.nc:
                raise ValueError(f"target classes must lie in 0..{self.nc - 1}, got {low[1]:g}..{high[1]:g}")
        self.step += 1
        return maps, targets

    # The targets as one tensor, ``[N, 6]`` (image index, class, cx, cy, w, h).
    _targets_tensor = staticmethod(targets_to_tensor)

    def _extra_channels(self) -> tuple[int, str]:
        """How many channels follow the class logits in each map, and what they are."""
        return self.nm, "mask coefficients"

    def _check_outputs(self, outputs: Sequence[torch.Tensor], pred_size: Sequence[int] | None) -> None:
        extra, what = self._extra_channels()
        channels = 4 * self.reg_max + self.nc + extra
        if isinstance(outputs, torch.Tensor) or len(outputs) != self.nl:
            raise ValueError(f"expected the {self.nl} raw head maps of a model in train() mode; "
                             "got decoded eval() output (call model.train())")
        for level in outputs:
            if level.ndim != 4 or level.shape[1] != channels:
                raise ValueError(f"head map of shape {tuple(level.shape)} does not match [B, {channels}, H, W] "
                                 f"(4 x {self.reg_max} box bins, {self.nc} classes, {extra} {what})")
        height, width = self._image_size(outputs, pred_size)
        if not self.rect_training and height != width:
            raise ValueError(f"non-square batch {height}x{width}: pass rect_training=True to train on "
                             "rectangular batches")

    def _detection_losses(self, predictions: Predictions, padded: PaddedTargets
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Assignment]:
        """Box, class and DFL losses (with their gains) and the assignment they were computed on."""
        class_logits = predictions.class_logits
        strides = predictions.strides
        assignment = self.assigner(class_logits.detach().sigmoid(), predictions.boxes.detach() * strides,
                                   predictions.points * strides, padded.labels, padded.boxes, padded.valid)
        score_sum = assignment.scores.sum().clamp(min=1)
        lcls = F.binary_cross_entropy_with_logits(class_logits, assignment.scores, reduction="sum")

        # Box terms on the foreground only, each weighted by its soft class target; in strides.
        image, point = assignment.foreground.nonzero(as_tuple=True)
        weight = assignment.scores[image, point].sum(-1)
        target_boxes = (assignment.boxes / strides)[image, point]
        iou = complete_iou_xyxy(predictions.boxes[image, point], target_boxes)
        lbox = ((1.0 - iou) * weight).sum()
        points = predictions.points[point]
        distances = torch.cat((points - target_boxes[:, :2], target_boxes[:, 2:] - points), -1)
        dfl = _distribution_focal_loss(predictions.distributions[image, point], distances)
        ldfl = (dfl * weight).sum()
        return (lbox / score_sum * self.hyp.box, lcls / score_sum * self.hyp.cls, ldfl / score_sum * self.hyp.dfl,
                assignment)


class PaddedTargets(NamedTuple):
    """The targets per image, padded to the largest count of any image: classes ``[B, M]``, boxes ``[B, M, 4]``
    (xyxy pixels), which entries are targets ``[B, M]``, and each entry's row in the ``[N, 6]`` targets (-1 on
    padding)."""

    labels: torch.Tensor
    boxes: torch.Tensor
    valid: torch.Tensor
    rows: torch.Tensor


def padded_targets(targets: torch.Tensor, batch_size: int, pixels: torch.Tensor) -> PaddedTargets:
    """The ``[N, 6]`` targets as the assigner takes them (boxes: the normalised ones times ``pixels``, width,
    height, width, height). Each image's targets keep their order: an entry's position is the 1-based index of its
    overlap mask minus one."""
    rows = padded_rows(targets[:, 0].long(), batch_size)
    valid = rows >= 0
    chosen = targets[rows.clamp(min=0)]                                                      # [B, M, 6]
    labels = torch.where(valid, chosen[..., 1], 0.0)
    boxes = torch.where(valid[..., None], xywh_to_xyxy(chosen[..., 2:6] * pixels), 0.0)
    return PaddedTargets(labels, boxes, valid, rows)


def padded_rows(image: torch.Tensor, batch_size: int) -> torch.Tensor:
    """``[B, M]``: the rows of each image's targets (``image`` holds each row's image index) in their order, padded
    with -1 to the largest count of any image."""
    counts = torch.bincount(image, minlength=batch_size)
    order = torch.argsort(image, stable=True)
    image_sorted = image[order]
    position = torch.arange(image.shape[0], device=image.device) - (counts.cumsum(0) - counts)[image_sorted]
    most = int(counts.max()) if image.numel() else 0
    rows = torch.full((batch_size, most), -1, dtype=torch.long, device=image.device)
    return rows.index_put((image_sorted, position), order)


def _distribution_focal_loss(distributions: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """Per box ``[n]``: the mean over its four sides of the cross-entropy of the side's distribution ``[n, 4, bins]``
    against the two bins around the target distance (in strides), weighted by how near each is (Li et al., 2020)."""
    bins = distributions.shape[-1]
    distances = distances.clamp(0, bins - 1 - LAST_BIN_MARGIN)
    below = distances.long()
    weight_below = (below + 1) - distances
    log_probs = distributions.log_softmax(-1)
    log_below = log_probs.gather(-1, below[..., None])[..., 0]
    log_above = log_probs.gather(-1, (below + 1)[..., None])[..., 0]
    return -(log_below * weight_below + log_above * (1 - weight_below)).mean(-1)


class AnchorFreeSegmentLoss(AnchorFreeLoss):
    """``criterion((maps, proto), targets, masks, pred_size=imgs.shape[2:4])`` → scalar loss.

    The maps carry ``nm`` mask coefficients as their last channels; ``proto`` ``[B, nm, h, w]`` are the
    prototypes. ``masks`` are taken as :class:`~yolotrain.loss.segment.SegmentLoss` takes them: with ``overlap``
    one ``[B, h, w]`` map per image whose values are the 1-based position of the target among its image's targets
    (0: background), else one ``[N, h, w]`` mask per target row. Masks of another size than the prototypes' are
    compared with the prototypes resized to them (bilinear), as ultralytics does. The mask term: per foreground
    point, the BCE of its mask (prototypes × its coefficients) against its target's, summed inside the target's
    box over the mask's area and over the box's (normalised) area; averaged over the foreground, with the box gain.
    The total is (box + seg + cls + dfl) × batch size; ``self.components`` holds the four detached parts in that
    order, ultralytics' order.
    """

    component_names = ("box", "seg", "cls", "dfl")

    def __init__(self, model: nn.Module, rect_training: bool = False, img_size: int | None = None,
                 hyp: AnchorFreeLossConfig | Mapping[str, float] | None = None, overlap: bool = True) -> None:
        super().__init__(model, rect_training, img_size, hyp)
        if not self.nm:
            raise ValueError("the segmentation loss needs a head with mask coefficients (nm > 0)")
        self.overlap = overlap

    def __call__(self, outputs: tuple[Sequence[torch.Tensor], torch.Tensor], targets: TargetsLike,
                 masks: torch.Tensor | None = None, pred_size: Sequence[int] | None = None) -> torch.Tensor:
        if not (isinstance(outputs, (tuple, list)) and len(outputs) == 2 and isinstance(outputs[1], torch.Tensor)):
            raise ValueError("expected (maps, proto) from a segmentation model in train() mode")
        if masks is None:
            raise ValueError("the segmentation loss needs the target masks")
        maps, proto = outputs
        maps, targets = self._prepare(maps, targets, pred_size)
        proto = proto.float() if proto.dtype in (torch.float16, torch.bfloat16) else proto
        batch_size = maps[0].shape[0]
        if proto.ndim != 4 or proto.shape[:2] != (batch_size, self.nm):
            raise ValueError(f"prototypes of shape {tuple(proto.shape)} do not match [{batch_size}, {self.nm}, h, w]")
        predictions = Predictions(maps, self.strides, self.reg_max, self.nc)
        padded = padded_targets(targets, batch_size, predictions.pixels)
        lbox, lcls, ldfl, assignment = self._detection_losses(predictions, padded)
        lseg = self._mask_loss(predictions, assignment, padded.rows, proto, masks) * self.hyp.box
        self.components = torch.stack((lbox, lseg, lcls, ldfl)).detach()
        total = (lbox + lseg + lcls + ldfl) * batch_size
        if torch.is_grad_enabled():
            self._check_diverged(total, [*maps, proto])
        return total

    def _mask_loss(self, predictions: Predictions, assignment: Assignment, rows: torch.Tensor, proto: torch.Tensor,
                   masks: torch.Tensor) -> torch.Tensor:
        """The mask term before its gain; computed only at the pixels inside the boxes (outside, ultralytics
        multiplies the BCE by zero: the same sum and gradient), one product of prototypes per image."""
        image, point = assignment.foreground.nonzero(as_tuple=True)  # image by image
        if not image.numel():
            # Nothing to compare: the prototypes and coefficients stay in the graph with zero gradients, so that
            # DistributedDataParallel finds every parameter used.
            return (proto * 0).sum() + (predictions.coefficients * 0).sum()
        masks = masks.to(proto.device)
        if tuple(masks.shape[-2:]) != tuple(proto.shape[-2:]):
            proto = F.interpolate(proto, masks.shape[-2:], mode="bilinear", align_corners=False)
        batch_size, nm, mask_h, mask_w = proto.shape
        target_index = assignment.target_index[image, point]
        normalised = assignment.boxes[image, point] / predictions.pixels
        area = xyxy_to_xywh(normalised)[:, 2:].prod(1)
        scale = torch.tensor([mask_w, mask_h, mask_w, mask_h], dtype=proto.dtype, device=proto.device)
        match, pixel = _box_pixels(normalised * scale, mask_h, mask_w)
        inside_logits = _inside_logits(predictions.coefficients[image, point], image,
                                       proto.reshape(batch_size, nm, mask_h * mask_w), match, pixel)
        if self.overlap:
            inside_target = masks.reshape(batch_size, -1)[image[match], pixel] == (target_index + 1)[match]
        else:
            inside_target = masks.reshape(masks.shape[0], -1)[rows[image, target_index][match], pixel]
        weight = 1 / (area * (mask_h * mask_w))
        total = F.binary_cross_entropy_with_logits(inside_logits, inside_target.to(proto.dtype), weight=weight[match],
                                                   reduction="sum")
        return total / image.numel()
