"""Oriented boxes' exports and runtimes: the decoded ``[B, N, 5+nc+1]`` predictions (the angle after the class
scores), rotated NMS after the runtime; no raw maps, NMS inside or int8. Checkpoints are detection's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...interop.exporting.graph import ExportGraph
from ...interop.runtime import ExportedModel, decoded_only_problem, output_shape_mismatch
from ..detect.export import DetectExport

ANGLE_COLUMNS = 1  # after the class scores: the angle in radians
# The formats whose exports of an oriented-box model give PyTorch's outputs (tests/test_anchor_free_export.py);
# Core ML (no runtime off macOS) and TensorRT (no GPU build here) were not checked, so they are refused.
EXPORT_FORMATS = frozenset({"onnx", "openvino", "torchscript", "ncnn", "mnn", "tflite", "executorch", "saved_model",
                            "pb", "tfjs", "paddle"})


class OBBExport(DetectExport):
    """Oriented boxes' answers about export and exported runtimes."""

    export_formats = EXPORT_FORMATS

    def export_format_refusal(self, fmt: str, supported: Sequence[str]) -> str:
        return f"oriented-box models export to {', '.join(supported)}, not {fmt}"

    def check_export_options(self, half: bool, int8: bool, raw: bool, nms: bool) -> None:
        if raw or nms:
            raise ValueError(f"{'--raw' if raw else '--nms'} is for detection models: an oriented-box model's export "
                             "gives its decoded rotated predictions (the rotated NMS runs after the runtime)")
        if int8:
            raise ValueError("int8 export is for detection models: how int8 rotated boxes and angles score is not "
                             "measured; export an oriented-box model in fp32 or fp16 (--half)")

    def export_metadata(self, model: Any) -> dict[str, str]:
        return {**super().export_metadata(model), "task": "obb"}

    def trace_export(self, graph: ExportGraph, images: torch.Tensor) -> torch.Tensor:
        # (exporting checks that neither raw maps nor NMS were asked for)
        return graph.model.head.decode(graph.model.forward_maps(images))

    def exported_metadata_problem(self, raw: bool, nms: bool) -> str | None:
        return decoded_only_problem("oriented-box", raw, nms)

    def exported_output_mismatch(self, runtime: ExportedModel, shapes: Sequence[Sequence[int | None]],
                                 input_hw: Sequence[int | None]) -> str | None:
        strides = [int(s) for s in runtime.stride.tolist()]
        height, width = input_hw
        cells = (None if height is None or width is None
                 else runtime.anchors_per_level * sum((height // s) * (width // s) for s in strides))
        return output_shape_mismatch(shapes, [None, cells, runtime.num_classes + 5 + ANGLE_COLUMNS],
                                     f"strides {strides}, nc {runtime.num_classes} and an angle")
