"""The YOLOv5 training loss: target assignment, CIoU box loss, objectness and class BCE.

Semantics follow the reference YOLOv5 (v6/v7) ``ComputeLoss``. The loss is a pure function of the
head outputs and the targets: it never writes into its inputs (nor into any tensor autograd saved),
so it cannot cause "modified by an inplace operation" errors in ``backward()``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..boxes import complete_iou
from ..settings import from_mapping, setting
from .divergence import DivergenceError


@dataclass(frozen=True)
class LossConfig:
    """Loss gains, before scaling for layers, classes and image size; the reference's scratch-low values. The
    anchor-free heads' loss reads ``box``, ``cls`` and ``dfl`` (their family's recipe sets its own gains), their
    oriented-box loss ``angle`` too, a pose model's also ``pose`` and ``kobj`` (ultralytics' gains)."""

    box: float = setting(0.05, "box (CIoU) loss gain", min=0)
    cls: float = setting(0.5, "class loss gain", min=0)
    obj: float = setting(1.0, "objectness loss gain", min=0)
    anchor_t: float = setting(4.0, "anchor-multiple threshold for assigning targets", above=1)
    cls_pw: float = setting(1.0, "class BCE weight of positive targets", above=0)
    obj_pw: float = setting(1.0, "objectness BCE weight of positive targets", above=0)
    fl_gamma: float = setting(0.0, "focal loss gamma for class and objectness (0: plain BCE)", min=0)
    label_smoothing: float = setting(0.0, "class label smoothing: targets 1-eps/2 and eps/2", min=0, max=1)
    dfl: float = setting(1.5, "distribution focal loss gain (anchor-free heads: yolov8, yolo11, yolov5u)", min=0)
    angle: float = setting(1.0, "angle loss gain (oriented-box models: yolov8n-obb ...)", min=0)
    pose: float = setting(12.0, "keypoint location loss gain (pose models)", min=0)
    kobj: float = setting(1.0, "keypoint visibility loss gain (pose models)", min=0)

# Objectness weight of each level: small objects (P3) dominate the count of cells. The reference uses
# the first table for three levels (P5 models) and the second for any other count (P6 models: 4).
LEVEL_BALANCE = (4.0, 1.0, 0.4)
LEVEL_BALANCE_OTHER = (4.0, 1.0, 0.25, 0.06, 0.02)
# A target is also assigned to the two neighbouring cells nearest its centre (beyond this fraction).
NEIGHBOUR_MARGIN = 0.5
# Head logits beyond this magnitude mean diverged weights. A well-trained head pushes background
# objectness and unused class logits to about -100 (float32 sigmoid gradients vanish past ~-104), so
# the bound sits an order of magnitude above anything training produces on its own.
SATURATED_LOGIT = 1000.0
# Focal loss weight of positive targets (negatives get 1 - alpha), the reference's fixed value.
FOCAL_ALPHA = 0.25
_CELL_OFFSETS = torch.tensor([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], dtype=torch.float32) * NEIGHBOUR_MARGIN

TargetsLike = torch.Tensor | np.ndarray | Sequence[torch.Tensor | np.ndarray]


class Matches(NamedTuple):
    """The predictions one level assigned to targets: per match, its image, its row in the targets and the
    prediction ``[m, no]`` (raw logits) at its anchor and cell."""

    image: torch.Tensor
    target_index: torch.Tensor
    predictions: torch.Tensor


def targets_to_tensor(targets: TargetsLike, device: torch.device | None = None) -> torch.Tensor:
    """Accept ``[N, 6]`` (image index, class, cx, cy, w, h) or a per-image list of ``[n, 5]`` rows."""
    if isinstance(targets, (torch.Tensor, np.ndarray)):
        table = torch.as_tensor(targets, dtype=torch.float32, device=device)
        if table.numel() == 0:
            table = table.reshape(0, 6)
        if table.ndim != 2 or table.shape[1] != 6:
            raise ValueError(f"targets must be [N, 6] (image, class, cx, cy, w, h), got shape {tuple(table.shape)}")
        return table
    rows = []
    for image_index, labels in enumerate(targets):
        labels = torch.as_tensor(labels, dtype=torch.float32, device=device).reshape(-1, 5)
        rows.append(F.pad(labels, (1, 0), value=float(image_index)))
    return torch.cat(rows) if rows else torch.zeros((0, 6), device=device)


class YoloLoss:
    """``criterion(outputs, targets, pred_size=imgs.shape[2:4])`` → scalar loss.

    The total is (box + obj + cls) × batch size, as the reference computes it; the detached parts
    are kept in ``self.components`` (a ``[3]`` tensor: box, obj, cls). ``rect_training=True`` declares
    that batches may be non-square (rectangular letterboxed batches); without it a non-square batch
    is refused, since it usually means images were not letterboxed as intended.
    """

    component_names = ("box", "obj", "cls")

    def __init__(self, model: nn.Module, rect_training: bool = False, img_size: int | None = None,
                 hyp: LossConfig | Mapping[str, float] | None = None) -> None:
        head = getattr(model, "module", model).head  # unwrap DistributedDataParallel
        self.rect_training = rect_training
        self.img_size = img_size
        self.hyp = hyp if isinstance(hyp, LossConfig) else from_mapping(LossConfig, hyp or {})
        self.head = head  # read anchors from it on each call: they follow the model across .to(device)
        self.nc, self.na, self.nl = head.nc, head.na, head.nl
        self.strides = tuple(int(s) for s in head.stride.tolist())
        self.balance = LEVEL_BALANCE if self.nl == 3 else LEVEL_BALANCE_OTHER
        if self.nl > len(self.balance):
            raise ValueError(f"the loss weighs at most {len(self.balance)} detection levels, the model has {self.nl}")
        self.components = torch.zeros(3)
        self.step = 0

    def __call__(self, outputs: Sequence[torch.Tensor], targets: TargetsLike,
                 pred_size: Sequence[int] | None = None) -> torch.Tensor:
        outputs, targets = self._prepare(outputs, targets, pred_size)
        lbox, lobj, lcls, _ = self._detection_losses(outputs, targets, pred_size)
        self.components = torch.stack((lbox, lobj, lcls)).detach()
        total = (lbox + lobj + lcls) * outputs[0].shape[0]
        if torch.is_grad_enabled():  # a training step; validation only reports its loss
            self._check_diverged(total, outputs)
        return total

    def _prepare(self, outputs: Sequence[torch.Tensor], targets: TargetsLike,
                 pred_size: Sequence[int] | None) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The head maps (checked, in float32 at least) and the targets as an ``[N, 6]`` tensor beside them."""
        self._check_outputs(outputs, pred_size)
        # Half-precision maps (autocast) are scored in float32: 8 or 11 significant bits cannot hold
        # the small differences between predicted and target boxes that the IoU terms depend on.
        outputs = [o.float() if o.dtype in (torch.float16, torch.bfloat16) else o for o in outputs]
        targets = targets_to_tensor(targets, outputs[0].device)
        if not torch.isfinite(targets).all():
            raise ValueError("targets contain NaN or infinite values")
        self.step += 1
        return outputs, targets

    @property
    def box_gain(self) -> float:
        """The box gain scaled for the number of levels, as the reference's train.py scales it."""
        return self.hyp.box * 3 / self.nl

    def _detection_losses(self, outputs: list[torch.Tensor], targets: torch.Tensor,
                          pred_size: Sequence[int] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                    list[Matches]]:
        """Box, objectness and class losses (with their gains), and each level's matched predictions."""
        device, dtype = outputs[0].device, outputs[0].dtype
        image_size = max(self._image_size(outputs, pred_size))
        cls_gain = self.hyp.cls * self.nc / 80 * 3 / self.nl
        obj_gain = self.hyp.obj * ((self.img_size or image_size) / 640) ** 2 * 3 / self.nl

        anchors = self.head.anchors.to(device=device, dtype=dtype)
        box_terms, obj_terms, cls_terms, matches = [], [], [], []
        for level, pred in enumerate(outputs):
            image, anchor, gy, gx, target_box, target_cls, target_index = self._assign(level, pred.shape, targets,
                                                                                       anchors[level])
            target_obj = torch.zeros(pred.shape[:4], dtype=dtype, device=device)
            matched = pred[image, anchor, gy, gx]
            matches.append(Matches(image, target_index, matched))
            if image.numel():
                pxy = matched[:, :2].sigmoid() * 2 - 0.5
                pwh = (matched[:, 2:4].sigmoid() * 2) ** 2 * anchors[level][anchor]
                iou = complete_iou(torch.cat((pxy, pwh), 1), target_box)
                box_terms.append((1.0 - iou).mean())
                # Objectness target: how well the box fits (IoU, detached), not just "an object is here".
                target_obj = target_obj.index_put((image, anchor, gy, gx), iou.detach().clamp(min=0).to(dtype))
                if self.nc > 1:
                    # Label smoothing: positives aim at 1 - eps/2, negatives at eps/2.
                    eps = self.hyp.label_smoothing
                    class_target = F.one_hot(target_cls, self.nc).to(dtype) * (1 - eps) + eps / 2
                    cls_terms.append(self._bce(matched[:, 5:5 + self.nc], class_target, self.hyp.cls_pw))
            obj_terms.append(self._bce(pred[..., 4], target_obj, self.hyp.obj_pw) * self.balance[level])

        zero = outputs[0].new_zeros(())
        lbox = sum(box_terms, zero) * self.box_gain
        lobj = sum(obj_terms, zero) * obj_gain
        lcls = sum(cls_terms, zero) * cls_gain
        return lbox, lobj, lcls, matches

    def _bce(self, logits: torch.Tensor, target: torch.Tensor, pos_weight: float) -> torch.Tensor:
        """Mean BCE with positive weight ``pos_weight``; with ``fl_gamma > 0`` the focal loss
        (each element weighted by alpha_t (1 - p_t)^gamma) around it, as the reference wraps it."""
        weight = None if pos_weight == 1 else logits.new_tensor([pos_weight], dtype=torch.float32)
        gamma = self.hyp.fl_gamma
        if gamma == 0:
            return F.binary_cross_entropy_with_logits(logits, target, pos_weight=weight)
        loss = F.binary_cross_entropy_with_logits(logits, target, pos_weight=weight, reduction="none")
        prob = logits.sigmoid()
        p_t = target * prob + (1 - target) * (1 - prob)
        alpha_t = target * FOCAL_ALPHA + (1 - target) * (1 - FOCAL_ALPHA)
        return (loss * alpha_t * (1.0 - p_t) ** gamma).mean()

    def _assign(self, level: int, shape: torch.Size, targets: torch.Tensor,
                anchors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Match targets to anchors (size ratio < anchor_t) and to their cell plus two nearest neighbours.

        Returns, per match: image, anchor and cell indices, the target box (offset in the cell, w, h in
        grid units), the class and the target's row in ``targets``.
        """
        ny, nx = shape[2], shape[3]
        device = targets.device
        grid_gain = torch.tensor([nx, ny, nx, ny], dtype=targets.dtype, device=device)
        boxes = targets[:, 2:6] * grid_gain                                    # [nt, 4] grid units
        ratio = boxes[None, :, 2:4] / anchors[:, None]                         # [na, nt, 2]
        fits = torch.max(ratio, 1 / ratio).amax(2) < self.hyp.anchor_t     # [na, nt]
        anchor_index, target_index = fits.nonzero(as_tuple=True)
        # The reference orders matches anchor-major; keep it so duplicate cells resolve identically.
        gxy = boxes[target_index, :2]
        gxy_inverse = grid_gain[:2] - gxy
        left, top = ((gxy % 1 < NEIGHBOUR_MARGIN) & (gxy > 1)).T
        right, bottom = ((gxy_inverse % 1 < NEIGHBOUR_MARGIN) & (gxy_inverse > 1)).T
        use = torch.stack((torch.ones_like(left), left, top, right, bottom))  # [5, m]
        offset_index, match = use.nonzero(as_tuple=True)
        offsets = _CELL_OFFSETS.to(device=device, dtype=targets.dtype)[offset_index]

        target_index = target_index[match]
        anchor = anchor_index[match]
        gxy = gxy[match]
        cell = (gxy - offsets).long()
        gx = cell[:, 0].clamp(0, nx - 1)
        gy = cell[:, 1].clamp(0, ny - 1)
        target_box = torch.cat((gxy - torch.stack((gx, gy), 1), boxes[target_index, 2:4]), 1)
        image = targets[target_index, 0].long()
        target_cls = targets[target_index, 1].long()
        return image, anchor, gy, gx, target_box, target_cls, target_index

    def _check_outputs(self, outputs: Sequence[torch.Tensor], pred_size: Sequence[int] | None) -> None:
        if isinstance(outputs, torch.Tensor) or len(outputs) != self.nl:
            raise ValueError(f"expected the {self.nl} raw head maps of a model in train() mode; "
                             "got decoded eval() output (call model.train() or model.forward_maps)")
        for pred in outputs:
            if pred.ndim != 5 or pred.shape[1] != self.na or pred.shape[4] != self.head.no:
                raise ValueError(f"head map of shape {tuple(pred.shape)} does not match "
                                 f"[B, {self.na}, H, W, {self.head.no}] for {self.nc} classes")
        height, width = self._image_size(outputs, pred_size)
        if not self.rect_training and height != width:
            raise ValueError(f"non-square batch {height}x{width}: pass rect_training=True to train on "
                             "rectangular batches")

    def _image_size(self, outputs: Sequence[torch.Tensor], pred_size: Sequence[int] | None) -> tuple[int, int]:
        """The batch image size, checked against the head maps when given."""
        from_maps = (outputs[0].shape[2] * self.strides[0], outputs[0].shape[3] * self.strides[0])
        if pred_size is None:
            return from_maps
        size = (int(pred_size[0]), int(pred_size[1]))
        if size != from_maps:
            raise ValueError(f"pred_size {size} does not match the head maps, which imply {from_maps}")
        return size

    def _check_diverged(self, total: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
        """Stop on a non-finite loss, or on head logits so large that every sigmoid is exactly 0 or 1.

        Both mean the weights have diverged; the second shows up first and would otherwise pass as a
        finite loss that never falls again.
        """
        peak = torch.stack([p.detach().abs().amax() for p in outputs]).amax()
        loss, peak_value = torch.stack((total.detach().float(), peak.float())).tolist()
        if math.isfinite(loss) and peak_value <= SATURATED_LOGIT:
            return
        parts = ", ".join(f"{n}={v:.4g}" for n, v in zip(self.component_names, self.components.tolist()))
        if not math.isfinite(peak_value):
            what = f"non-finite loss at step {self.step} ({parts}): the model's outputs are already non-finite"
        elif not math.isfinite(loss):
            what = f"non-finite loss at step {self.step} ({parts}): the loss overflowed"
        else:
            what = (f"diverging at step {self.step}: head logits reach {peak_value:.3g} (beyond ±{SATURATED_LOGIT:g} "
                    "every sigmoid is exactly 0 or 1 and the gradients vanish)")
        raise DivergenceError(
            f"{what}. The weights diverged in earlier updates; the usual cause is a learning rate far too high "
            "(typical: 1e-3 for Adam/AdamW, 1e-2 for SGD): lower it, or use warm-up and gradient clipping.")


YOLO_LOSS = YoloLoss
