"""Instance masks of a segmentation model: from prototypes and coefficients to binary masks, in the
network input or the original image, and out as IoUs, polygons and COCO run-length encodings.

A segmentation head gives per image ``nm`` prototype masks ``[nm, H/4, W/4]`` and per detection ``nm``
coefficients; a detection's mask is ``sigmoid(coefficients @ prototypes) > 0.5`` inside its box. The
crop follows the reference (``utils/segment/general.py``): pixel ``(x, y)`` (its index, not its centre) is
inside a box ``x1 <= x < x2, y1 <= y < y2``, so masks, and the mask mAP, agree with it pixel for pixel.

Masks are computed at the prototype resolution for metrics (what the reference validates on), or at
full resolution ("retina": upsampled before the crop) in bounded chunks of detections, so a picture
with hundreds of detections never holds them all at full size.
"""

from __future__ import annotations

from collections.abc import Iterator

import cv2
import numpy as np
import torch
import torch.nn.functional as F

# Detections whose full-resolution masks are made at once: bounds memory on large images (300 masks of
# a 4000 x 3000 picture would take 3.6 GB as float32).
MASK_CHUNK = 32


# Beyond this distance from 0 a float32 logit's sigmoid is above 0.5 (positive) or at most 0.5 (negative)
# with any exp kernel; nearer 0, exp(-x) may round to 1 (sigmoid exactly 0.5) or not, as the kernel and the
# value's place in the tensor (vectorised body or scalar tail) decide.
SIGMOID_TIE = 1e-6


def mask_logits(proto: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """``[n, h, w]`` mask logits of ``[n, nm]`` coefficients over one image's ``[nm, h, w]`` prototypes."""
    nm, h, w = proto.shape
    return (coefficients.float() @ proto.float().reshape(nm, -1)).reshape(-1, h, w)


def mask_probabilities(proto: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """``[n, h, w]`` mask probabilities of ``[n, nm]`` coefficients over one image's ``[nm, h, w]`` prototypes."""
    return mask_logits(proto, coefficients).sigmoid()


def _inside_boxes(boxes: torch.Tensor, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per box, which pixel rows ``[n, h, 1]`` and columns ``[n, 1, w]`` (bool) it covers: index x is inside
    when ``x1 <= x < x2`` (likewise y). Their ``&`` is the box; kept apart, they cost no full-size pass."""
    x1, y1, x2, y2 = boxes[:, :4, None].float().unbind(1)
    cols = torch.arange(w, device=boxes.device, dtype=torch.float32)
    rows = torch.arange(h, device=boxes.device, dtype=torch.float32)
    return ((rows >= y1) & (rows < y2))[:, :, None], ((cols >= x1) & (cols < x2))[:, None, :]


def process_masks(proto: torch.Tensor, coefficients: torch.Tensor, boxes: torch.Tensor,
                  input_hw: tuple[int, int], keep: torch.Tensor | None = None) -> torch.Tensor:
    """Binary masks ``[n, h, w]`` (bool) at the prototype resolution, cropped to ``boxes`` (xyxy in the
    ``input_hw`` network-input pixels): what validation compares with the labels' masks; with ``keep``
    (bool ``[n]``) only those detections' masks.

    The pixels of ``sigmoid(logits) > 0.5``, the reference's, read from the logits' sign without a sigmoid
    unless a logit inside a box lies within :data:`SIGMOID_TIE` of 0: then the sigmoid of every logit is
    taken as the reference takes it. The logits are one product over all the detections even with ``keep``:
    a product of fewer rows may round differently.
    """
    _, h, w = proto.shape
    scale = boxes.new_tensor((w / input_hw[1], h / input_hw[0], w / input_hw[1], h / input_hw[0]))
    logits = mask_logits(proto, coefficients)
    kept, boxes = (logits, boxes) if keep is None else (logits[keep], boxes[keep])
    rows, cols = _inside_boxes(boxes[:, :4] * scale, h, w)
    masks = _crop_(kept > SIGMOID_TIE, rows, cols)
    near_or_above = _crop_(kept >= -SIGMOID_TIE, rows, cols)
    if int(torch.count_nonzero(near_or_above)) == int(torch.count_nonzero(masks)):  # no logit in a box near 0
        return masks
    probabilities = logits.sigmoid()
    return _crop_((probabilities if keep is None else probabilities[keep]) > 0.5, rows, cols)


def _binary_in_boxes(probabilities: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """``probabilities [n, h, w] > 0.5`` inside ``boxes`` (the masks' pixels), False outside: the crop and
    the threshold in bool arithmetic, the same pixels as cropping the probabilities first."""
    rows, cols = _inside_boxes(boxes, *probabilities.shape[1:])
    return _crop_(probabilities > 0.5, rows, cols)


def _crop_(masks: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``masks [n, h, w]`` (bool) made False, in place, outside each box's ``rows [n, h, 1]`` and ``cols
    [n, 1, w]`` (bool): as products of their bytes, several times faster than a broadcast bool ``&``."""
    masks.view(torch.uint8).mul_(rows.view(torch.uint8)).mul_(cols.view(torch.uint8))
    return masks


def upsampled_masks(proto: torch.Tensor, coefficients: torch.Tensor, boxes: torch.Tensor,
                    input_hw: tuple[int, int], chunk: int = MASK_CHUNK) -> Iterator[torch.Tensor]:
    """Binary masks at the network input's resolution, ``chunk`` detections at a time: the probabilities
    upsampled (bilinear) before the crop to ``boxes`` (xyxy input pixels), the reference's native masks."""
    for start in range(0, coefficients.shape[0], chunk):
        probs = mask_probabilities(proto, coefficients[start:start + chunk])
        probs = F.interpolate(probs[None], input_hw, mode="bilinear", align_corners=False)[0]
        yield _binary_in_boxes(probs, boxes[start:start + chunk, :4])


def masks_in_original(proto: torch.Tensor, coefficients: torch.Tensor, boxes: torch.Tensor,
                      input_hw: tuple[int, int], pad: tuple[float, float], resized_wh: tuple[float, float],
                      original_hw: tuple[int, int], chunk: int = MASK_CHUNK) -> Iterator[torch.Tensor]:
    """Binary masks ``[k, h0, w0]`` of the original image, ``chunk`` detections at a time ("retina masks").

    The prototypes' letterbox border (``pad`` (left, top) and the ``resized_wh`` image inside the input,
    both in input pixels) is cut away, the probabilities are upsampled straight to ``original_hw`` and
    cropped to ``boxes`` given in original pixels: sharp edges at any image size, and no input-size mask
    of every detection held on the way.
    """
    _, h, w = proto.shape
    sy, sx = h / input_hw[0], w / input_hw[1]
    top, left = int(pad[1] * sy), int(pad[0] * sx)
    bottom, right = int(round((pad[1] + resized_wh[1]) * sy)), int(round((pad[0] + resized_wh[0]) * sx))
    content = proto[:, top:max(bottom, top + 1), left:max(right, left + 1)]
    for start in range(0, coefficients.shape[0], chunk):
        probs = mask_probabilities(content, coefficients[start:start + chunk])
        probs = F.interpolate(probs[None], original_hw, mode="bilinear", align_corners=False)[0]
        yield _binary_in_boxes(probs, boxes[start:start + chunk, :4])


def scale_masks_to_original(masks: torch.Tensor, pad: tuple[float, float], resized_wh: tuple[float, float],
                            original_hw: tuple[int, int]) -> torch.Tensor:
    """Binary ``masks [n, H, W]`` of the network input → ``[n, h0, w0]`` of the original image: the
    letterbox border cut away (``pad`` (left, top) and the ``resized_wh`` image inside, input pixels),
    the rest resized bilinearly and thresholded at 0.5."""
    top, left = int(pad[1]), int(pad[0])
    content = masks[:, top:top + int(resized_wh[1]), left:left + int(resized_wh[0])].float()
    if masks.shape[0] == 0:
        return torch.zeros((0, *original_hw), dtype=torch.bool, device=masks.device)
    return F.interpolate(content[None], original_hw, mode="bilinear", align_corners=False)[0] > 0.5


def mask_iou(masks1: torch.Tensor, masks2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """IoU ``[m, n]`` of two sets of binary masks ``[m, h, w]`` and ``[n, h, w]`` (one matrix product)."""
    a = masks1.flatten(1).float()  # flatten: reshape(0, -1) of an empty set of masks is ambiguous
    b = masks2.flatten(1).float()
    intersection = (a @ b.T).clamp(min=0)
    union = a.sum(1)[:, None] + b.sum(1)[None] - intersection
    return intersection / (union + eps)


def split_overlap_mask(overlap: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` binary masks ``[count, h, w]`` of an overlap mask ``[h, w]`` where pixel value k + 1
    marks instance k (the labels of an image in order; 0 is background)."""
    index = torch.arange(1, count + 1, device=overlap.device)
    return overlap[None] == index[:, None, None].to(overlap.dtype)


def masks_to_polygons(masks: torch.Tensor | np.ndarray, strategy: str = "largest") -> list[np.ndarray]:
    """One ``(k, 2)`` float32 polygon (x, y pixel coordinates) per binary mask, from its outer contours:
    the one with most points (``largest``) or all of them joined (``concat``); ``(0, 2)`` for an empty mask."""
    if strategy not in ("largest", "concat"):
        raise ValueError(f"strategy must be 'largest' or 'concat', got {strategy!r}")
    arrays = masks.cpu().numpy() if isinstance(masks, torch.Tensor) else np.asarray(masks)
    polygons = []
    for mask in arrays.astype(np.uint8):
        contours = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)[0]
        if not contours:
            polygons.append(np.zeros((0, 2), np.float32))
        elif strategy == "largest":
            polygons.append(max(contours, key=len).reshape(-1, 2).astype(np.float32))
        else:
            polygons.append(np.concatenate([c.reshape(-1, 2) for c in contours]).astype(np.float32))
    return polygons


def polygons_or_boxes(polygons: list[np.ndarray], boxes: torch.Tensor | np.ndarray) -> list[np.ndarray]:
    """Each detection's polygon, or where it has fewer than 3 points (a mask empty, one pixel or one line at its
    resolution: no outline encloses an area) its box's corners ``x1 y1, x2 y1, x2 y2, x1 y2`` (``boxes`` xyxy
    in the polygons' pixels): every detection gets a polygon a YOLO-seg label row (``class x1 y1 x2 y2 ...``,
    at least 3 points) can hold."""
    corners = (boxes.cpu().numpy() if isinstance(boxes, torch.Tensor) else np.asarray(boxes))[:, :4]
    corners = corners.astype(np.float32)[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 4, 2)
    return [polygon if len(polygon) >= 3 else box for polygon, box in zip(polygons, corners)]


def masks_to_rle(masks: torch.Tensor | np.ndarray) -> list[dict]:
    """COCO run-length encodings (``{"size": [h, w], "counts": str}``) of binary masks ``[n, h, w]``.

    Raises:
        ImportError: ``pycocotools`` is not installed.
    """
    try:
        from pycocotools import mask as coco_mask
    except ImportError as exc:
        raise ImportError("COCO mask encoding needs pycocotools: pip install pycocotools") from exc
    arrays = masks.cpu().numpy() if isinstance(masks, torch.Tensor) else np.asarray(masks)
    if arrays.shape[0] == 0:
        return []
    encoded = coco_mask.encode(np.asfortranarray(arrays.transpose(1, 2, 0).astype(np.uint8)))
    return [{"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")} for rle in encoded]

