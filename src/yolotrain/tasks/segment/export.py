"""Segmentation's exports and runtimes: detection's decoded boxes with mask coefficients, and the prototype
masks as a second output; no raw maps, NMS inside or int8."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...interop.exporting.graph import BOXES, MASK_PROTOTYPES, ExportGraph
from ...interop.runtime import ExportedModel, decoded_only_problem, differs, shape_text
from ..detect.export import DetectExport


class SegmentExport(DetectExport):
    """Segmentation's answers about export and exported runtimes; its checkpoints are detection's."""

    export_outputs: tuple[str, ...] = (BOXES, MASK_PROTOTYPES)

    def export_format_refusal(self, fmt: str, supported: Sequence[str]) -> str:
        return f"segmentation models export to {', '.join(supported)}: {fmt} cannot carry their prototype masks"

    def check_export_options(self, half: bool, int8: bool, raw: bool, nms: bool) -> None:
        if raw or nms:
            raise ValueError(f"{'--raw' if raw else '--nms'} is for detection models: a segmentation model's export "
                             "gives its decoded predictions and prototype masks")
        if int8:
            raise ValueError("int8 export is for detection models: how int8 prototype masks score is not measured; "
                             "export a segmentation model in fp32 or fp16 (--half)")

    def export_metadata(self, model: Any) -> dict[str, str]:
        return {**super().export_metadata(model), "task": "segment", "nm": str(model.num_masks)}

    def trace_export(self, graph: ExportGraph, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # (exporting checks that neither raw maps nor NMS were asked for)
        maps, proto = graph.model.forward_maps(images)
        return graph.model.head.decode(maps), proto

    def exported_metadata_problem(self, raw: bool, nms: bool) -> str | None:
        return decoded_only_problem("segmentation", raw, nms)

    def exported_output_mismatch(self, runtime: ExportedModel, shapes: Sequence[Sequence[int | None]],
                                 input_hw: Sequence[int | None]) -> str | None:
        proto = [None, runtime.num_masks] + [None if s is None else s // 4 for s in input_hw]
        if len(shapes) != 2:
            return f"a segmentation model has 2 outputs (predictions, prototype masks), it has {len(shapes)}"
        if len(shapes[1]) != 4 or any(differs(g, e) for g, e in zip(shapes[1], proto)):
            return (f"nm {runtime.num_masks} means prototype masks of {shape_text(proto)}, it gives "
                    f"{shape_text(shapes[1])}")
        return super().exported_output_mismatch(runtime, shapes[:1], input_hw)
