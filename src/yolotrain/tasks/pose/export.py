"""Pose's exports and runtimes: detection's decoded rows with the keypoints after the class scores
(``[B, N, 5 + nc + K*D]``) and ``kpt_shape`` in the metadata; no raw maps, NMS inside or int8."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from ...interop.exporting.graph import ExportGraph
from ...interop.runtime import ExportedModel, decoded_only_problem, output_shape_mismatch
from ..detect.export import DetectExport

# The formats whose exports of a pose model give PyTorch's outputs (tests/test_anchor_free_export.py); Core ML
# (no runtime off macOS) and TensorRT (no GPU build here) were not checked, so they are refused.
EXPORT_FORMATS = frozenset({"onnx", "openvino", "torchscript", "ncnn", "mnn", "tflite", "executorch", "saved_model",
                            "pb", "tfjs", "paddle"})


class PoseExport(DetectExport):
    """Pose's answers about export and exported runtimes; its checkpoints are detection's (the family records
    ``kpt_shape``)."""

    export_formats = EXPORT_FORMATS

    def export_format_refusal(self, fmt: str, supported: Sequence[str]) -> str:
        return f"pose models export to {', '.join(supported)}, not {fmt}"

    def check_export_options(self, half: bool, int8: bool, raw: bool, nms: bool) -> None:
        if raw or nms:
            raise ValueError(f"{'--raw' if raw else '--nms'} is for detection models: a pose model's export gives its "
                             "decoded predictions with their keypoints")
        if int8:
            raise ValueError("int8 export is for detection models: how int8 keypoints score is not measured; export a "
                             "pose model in fp32 or fp16 (--half)")

    def export_metadata(self, model: Any) -> dict[str, str]:
        return {**super().export_metadata(model), "task": "pose", "kpt_shape": json.dumps(list(model.kpt_shape))}

    def trace_export(self, graph: ExportGraph, images: torch.Tensor) -> torch.Tensor:
        # (exporting checks that neither raw maps nor NMS were asked for)
        return graph.model.head.decode(graph.model.forward_maps(images))

    def exported_metadata_problem(self, raw: bool, nms: bool) -> str | None:
        return decoded_only_problem("pose", raw, nms)

    def exported_output_mismatch(self, runtime: ExportedModel, shapes: Sequence[Sequence[int | None]],
                                 input_hw: Sequence[int | None]) -> str | None:
        if runtime.kpt_shape is None:
            return "a pose model's metadata has its kpt_shape, this one has none"
        keypoints, dims = runtime.kpt_shape
        strides = [int(s) for s in runtime.stride.tolist()]
        height, width = input_hw
        cells = None if height is None or width is None else sum((height // s) * (width // s) for s in strides)
        return output_shape_mismatch(shapes, [None, cells, runtime.num_classes + 5 + keypoints * dims],
                                     f"strides {strides}, nc {runtime.num_classes} and kpt_shape {[keypoints, dims]}")
