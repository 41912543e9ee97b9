"""The module every export traces: the fused model with its output chosen by its task (a detector's decoded
predictions, raw head maps, or final detections with NMS inside, built from ONNX's ``NonMaxSuppression``; a
segmentation model's decoded predictions with its prototype masks as a second output; a classifier's logits),
and the output kinds an export can carry.

An output kind names what one of an exported graph's outputs holds. Each task declares the kinds its exports
give (:attr:`yolotrain.task.Task.export_outputs`) and each format the kinds it can carry
(:attr:`yolotrain.interop.formats.ExportFormat.outputs`): a model exports to the formats that carry all of its.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from ...boxes import xywh_to_xyxy
from ...model import Yolov5
from ...task import task_of

DECODED_OUTPUT = "output0"
# A segmentation model's prototype masks [B, nm, H/4, W/4] (the reference's name for them).
PROTO_OUTPUT = "output1"
DETECTIONS_OUTPUT = "detections"

# Output kinds. Boxes: decoded predictions [B, N, 5+nc(+nm)] (or, asked for, the raw head maps or final
# detections); mask prototypes: a segmentation model's [B, nm, H/4, W/4]; logits: a classifier's [B, nc].
BOXES = "boxes"
MASK_PROTOTYPES = "mask_prototypes"
LOGITS = "logits"


class NonMaxSuppression(torch.autograd.Function):
    """ONNX ``NonMaxSuppression``: per image and class, the boxes kept, as ``[K, 3]`` (image, class, box)
    rows. The forward is the same computation in PyTorch, so the traced module also runs eagerly."""

    @staticmethod
    def forward(ctx, boxes: torch.Tensor, scores: torch.Tensor, max_per_class: torch.Tensor,
                iou: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
        from torchvision.ops import nms

        rows = []
        for b, c in itertools.product(range(scores.shape[0]), range(scores.shape[1])):
            candidates = (scores[b, c] > score).nonzero().view(-1)
            kept = candidates[nms(boxes[b, candidates], scores[b, c, candidates], float(iou))][:int(max_per_class)]
            rows.append(torch.stack((torch.full_like(kept, b), torch.full_like(kept, c), kept), 1))
        return torch.cat(rows) if rows else torch.zeros(0, 3, dtype=torch.long)

    @staticmethod
    def symbolic(g, boxes, scores, max_per_class, iou, score):
        return g.op("NonMaxSuppression", boxes, scores, max_per_class, iou, score, center_point_box_i=0)


class ExportGraph(nn.Module):
    """What gets traced: images → the outputs the model's task gives (see
    :meth:`yolotrain.task.Task.trace_export`): a detector's decoded output, its raw maps as a tuple, or final
    detections (:meth:`detections`)."""

    def __init__(self, model: Yolov5, raw: bool, nms: dict | None = None) -> None:
        super().__init__()
        self.model = model
        self.task = task_of(model)  # asked while tracing: looked up once, before
        self.raw = raw
        self.nms = nms

    def forward(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return self.task.trace_export(self, images)

    def detections(self, pred: torch.Tensor) -> torch.Tensor:
        """Decoded output → ``[B, max_det, 6]``, the semantics of :func:`yolotrain.eval.non_max_suppression`
        (objectness and score above ``conf``, class-aware NMS, the ``max_det`` best per image) in fixed
        shapes: the kept (image, class, box) triples are marked in a dense score map whose ``max_det``
        largest entries are the detections."""
        conf, max_det = self.nms["conf"], self.nms["max_det"]
        boxes = xywh_to_xyxy(pred[..., :4])
        objectness = pred[..., 4:5]
        scores = pred[..., 5:] * objectness * (objectness > conf)
        if not self.nms["multi_label"]:  # only each box's best class is a candidate
            classes = torch.arange(scores.shape[2], device=scores.device)
            scores = scores * (classes == scores.argmax(2, keepdim=True))
        scores = scores.transpose(1, 2)  # [B, C, N], as ONNX's NonMaxSuppression takes them
        kept = NonMaxSuppression.apply(boxes, scores, torch.tensor([max_det]), torch.tensor([self.nms["iou"]]),
                                        torch.tensor([conf]))
        marks = torch.zeros_like(scores)
        marks[kept[:, 0], kept[:, 1], kept[:, 2]] = 1.0
        batch, num_classes, num_boxes = scores.shape
        # max_det zero columns: top-k stays defined when fewer than max_det pairs exist at small sizes.
        flat = torch.cat(((scores * marks).flatten(1), scores.new_zeros(batch, max_det)), 1)
        top, index = flat.topk(max_det, 1)
        box_index = index % num_boxes
        top_boxes = boxes.gather(1, box_index.unsqueeze(2).expand(-1, -1, 4))
        top_classes = torch.div(index, num_boxes, rounding_mode="floor").clamp(max=num_classes - 1)
        return torch.cat((top_boxes * (top > 0).unsqueeze(2), top.unsqueeze(2), top_classes.unsqueeze(2).to(top)), 2)


def raw_output_names(model: Yolov5) -> tuple[str, ...]:
    """Names of the raw head maps: ``p3``, ``p4``, ``p5`` (and ``p6`` on P6 models), by level stride."""
    return tuple(f"p{int(s).bit_length() - 1}" for s in model.head.stride.tolist())
