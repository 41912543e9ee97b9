"""The YOLOv5 segmentation loss: the detection loss of :mod:`yolotrain.loss.detect` plus a mask term.

Semantics follow the reference's ``utils/segment/loss.py`` ``ComputeLoss``: every prediction assigned to
a target combines the prototypes with its mask coefficients; the BCE against the target's mask, kept
inside the target's box, averaged over the mask and divided by the box's area, is averaged per image and
summed over images and levels, with the box gain over the batch size. Here the BCE is computed only at
the pixels inside each box (outside, the reference multiplies it by zero: the same sum, and the same
gradient), each image's masks are one product, and nothing is written in place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from .detect import LossConfig, Matches, TargetsLike, YoloLoss


class SegmentLoss(YoloLoss):
    """``criterion((maps, proto), targets, masks, pred_size=imgs.shape[2:4])`` → scalar loss.

    ``masks`` holds the target masks at the prototypes' resolution or any other (resized to it, nearest):
    with ``overlap`` one ``[B, h, w]`` map per image whose values are the 1-based row of the target within
    its image's targets (0: background), else one ``[N, h, w]`` binary mask per target row. The total is
    (box + seg + obj + cls) × batch size; ``self.components`` holds the four detached parts in that order.
    """

    component_names = ("box", "seg", "obj", "cls")

    def __init__(self, model: torch.nn.Module, rect_training: bool = False, img_size: int | None = None,
                 hyp: LossConfig | Mapping[str, float] | None = None, overlap: bool = True) -> None:
        super().__init__(model, rect_training, img_size, hyp)
        self.nm = self.head.nm
        self.overlap = overlap
        self.components = torch.zeros(4)

    def __call__(self, outputs: tuple[Sequence[torch.Tensor], torch.Tensor], targets: TargetsLike,
                 masks: torch.Tensor | None = None, pred_size: Sequence[int] | None = None) -> torch.Tensor:
        if not (isinstance(outputs, (tuple, list)) and len(outputs) == 2 and isinstance(outputs[1], torch.Tensor)):
            raise ValueError("expected (maps, proto) from a segmentation model in train() mode")
        if masks is None:
            raise ValueError("the segmentation loss needs the target masks")
        maps, proto = outputs
        maps, targets = self._prepare(maps, targets, pred_size)
        proto = proto.float() if proto.dtype in (torch.float16, torch.bfloat16) else proto
        lbox, lobj, lcls, matches = self._detection_losses(maps, targets, pred_size)
        batch_size = maps[0].shape[0]
        grids = [(p.shape[3], p.shape[2]) for p in maps]
        lseg = self._mask_loss(matches, grids, proto, targets, masks) * self.box_gain / batch_size
        self.components = torch.stack((lbox, lseg, lobj, lcls)).detach()
        total = (lbox + lseg + lobj + lcls) * batch_size
        if torch.is_grad_enabled():
            self._check_diverged(total, [*maps, proto])
        return total

    def _mask_indices(self, targets: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Per target row, its mask: the 1-based position among its image's rows (overlap masks, counted as
        the reference counts them: rows taken in order, image by image) or the row itself."""
        rows = torch.arange(targets.shape[0], device=targets.device)
        if not self.overlap:
            return rows
        counts = torch.bincount(targets[:, 0].long(), minlength=batch_size)
        starts = counts.cumsum(0) - counts
        group = torch.repeat_interleave(torch.arange(batch_size, device=targets.device), counts)
        return rows - starts[group] + 1

    def _mask_loss(self, matches: list[Matches], grids: list[tuple[int, int]], proto: torch.Tensor,
                   targets: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """The mask term before its gain: per level, the mean over each image's matches, summed over images
        (``grids``: each level's map width and height)."""
        batch_size, nm, mask_h, mask_w = proto.shape
        masks = masks.to(proto.device)
        if tuple(masks.shape[-2:]) != (mask_h, mask_w):
            masks = F.interpolate(masks[None].float(), (mask_h, mask_w), mode="nearest")[0]
        mask_index = self._mask_indices(targets, batch_size)
        scale = torch.tensor([mask_w, mask_h, mask_w, mask_h], dtype=proto.dtype, device=proto.device)
        flat_proto = proto.reshape(batch_size, nm, mask_h * mask_w)
        total = proto.new_zeros(())
        for (image, target_index, predictions), (nx, ny) in zip(matches, grids):
            if not image.numel():
                continue
            # Matches image by image, so that each image's masks are one product (the sum below is the same).
            order = torch.argsort(image, stable=True)
            image, target_index, predictions = image[order], target_index[order], predictions[order]
            # The normalised box as the reference recovers it from grid units (the same rounding).
            grid_gain = torch.tensor([nx, ny, nx, ny], dtype=targets.dtype, device=targets.device)
            xywhn = (targets[target_index, 2:6] * grid_gain / grid_gain).to(proto.dtype)
            match, pixel = _box_pixels(_xywh_to_xyxy(xywhn * scale), mask_h, mask_w)
            inside_logits = _inside_logits(predictions[:, -nm:], image, flat_proto, match, pixel)
            if self.overlap:
                owner = mask_index[target_index]
                inside_target = masks.reshape(batch_size, -1)[image[match], pixel] == owner[match]
            else:
                inside_target = masks.reshape(masks.shape[0], -1)[mask_index[target_index][match], pixel]
            # Per match: the mean over the whole mask (zeros outside the box), over the box's area, averaged
            # over its image's matches; one weighted sum over the pixels inside the boxes.
            per_image = torch.bincount(image, minlength=batch_size).to(proto.dtype)
            weight = 1 / (xywhn[:, 2:].prod(1) * (mask_h * mask_w) * per_image[image])
            total = total + F.binary_cross_entropy_with_logits(
                inside_logits, inside_target.to(proto.dtype), weight=weight[match], reduction="sum")
        return total


def _inside_logits(coefficients: torch.Tensor, image: torch.Tensor, flat_proto: torch.Tensor,
                   match: torch.Tensor, pixel: torch.Tensor) -> torch.Tensor:
    """The mask logit ``coefficients[match] @ flat_proto[image[match]][:, pixel]`` of every ``(match, pixel)``
    pair (``image`` and ``match`` sorted): one product per image over that image's matches, as the reference
    computes them, of which only the pairs are kept. Packing the matches into a padded ``[B, most, nm]`` table
    for one batched product costs more than it saves (the padding is computed too, and the gather back from
    ``[B, most, h*w]`` dominates); so does joining the images' full products before picking the pairs."""
    batch_size, _, area = flat_proto.shape
    match_counts = torch.bincount(image, minlength=batch_size)
    first_match = (match_counts.cumsum(0) - match_counts)[image[match]]
    local = (match - first_match) * area + pixel
    pair_counts = torch.bincount(image[match], minlength=batch_size).tolist()
    return torch.cat([(coefficients_of_image @ proto).flatten()[local_of_image]
                      for coefficients_of_image, proto, local_of_image, count in
                      zip(coefficients.split(match_counts.tolist()), flat_proto, local.split(pair_counts),
                          match_counts.tolist())
                      if count])


def _xywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    xy, wh = boxes[:, :2], boxes[:, 2:]
    return torch.cat((xy - wh / 2, xy + wh / 2), 1)


def _box_pixels(boxes: torch.Tensor, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pixels inside each box of ``boxes [n, 4]`` (xyxy in pixels; ``x1 <= col < x2``, ``y1 <= row < y2``,
    the reference's ``crop_mask``) as ``(box index, row * w + col)`` pairs, box by box, row by row. The
    integer bounds are exact: ``col >= x1`` is ``col >= ceil(x1)`` and ``col < x2`` is ``col < ceil(x2)``."""
    limits = torch.tensor([w, h, w, h], device=boxes.device, dtype=boxes.dtype)
    x1, y1, x2, y2 = torch.minimum(boxes.ceil().clamp(min=0), limits).long().unbind(1)
    widths, heights = (x2 - x1).clamp(min=0), (y2 - y1).clamp(min=0)
    counts = widths * heights
    box = torch.repeat_interleave(torch.arange(boxes.shape[0], device=boxes.device), counts)
    offset = torch.arange(box.shape[0], device=boxes.device) - (counts.cumsum(0) - counts)[box]
    box_width = widths[box]
    rows = y1[box] + offset // box_width
    cols = x1[box] + offset % box_width
    return box, rows * w + cols
