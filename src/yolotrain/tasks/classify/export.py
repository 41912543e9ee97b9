"""Classification's exports, runtimes and checkpoints: float32 logits ``[B, nc]`` (no anchors, raw maps, NMS
or reduced precision), and checkpoints rebuilt by the classifier's name, cut and class count."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...checkpoint import validate_classifier_metadata
from ...interop.exporting.graph import LOGITS, ExportGraph
from ...interop.loading.classify import checkpoint_classifier
from ...interop.runtime import ExportedModel, decoded_only_problem, output_shape_mismatch
from ...model.classify import Classifier


class ClassifyExport:
    """Classification's answers about export, exported runtimes and checkpoints."""

    export_outputs: tuple[str, ...] = (LOGITS,)

    def export_format_refusal(self, fmt: str, supported: Sequence[str]) -> str:
        return f"classifiers export to {', '.join(supported)}, not {fmt}"

    def check_export_options(self, half: bool, int8: bool, raw: bool, nms: bool) -> None:
        asked = [flag for flag, on in (("--half", half), ("--int8", int8), ("--raw", raw), ("--nms", nms)) if on]
        if asked:
            raise ValueError(f"{asked[0]} is for detection models: a classifier's export gives float32 logits")

    def export_metadata(self, model: Classifier) -> dict[str, str]:
        # Logits [B, nc]: no anchors to record.
        return {"model": model.arch, "task": "classify", "nc": str(model.num_classes)}

    def trace_export(self, graph: ExportGraph, images: torch.Tensor) -> torch.Tensor:
        return graph.model(images)

    def exported_metadata_problem(self, raw: bool, nms: bool) -> str | None:
        return decoded_only_problem("classification", raw, nms)

    def exported_output_mismatch(self, runtime: ExportedModel, shapes: Sequence[Sequence[int | None]],
                                 input_hw: Sequence[int | None]) -> str | None:
        return output_shape_mismatch(shapes, [None, runtime.num_classes], f"nc {runtime.num_classes} of a classifier")

    def exported_default_img_size(self, runtime: ExportedModel) -> int:
        return runtime.img_size[0]  # the size it was exported at, also with a free image size

    def checkpoint_architecture(self, model: Classifier) -> dict[str, Any]:
        # Rebuilt by name, cut and class count.
        return {"task": "classify", "arch": model.arch, "cutoff": model.cutoff, "nc": int(model.num_classes),
                "in_channels": int(model.in_channels)}

    def checkpoint_num_classes(self, model: Classifier) -> int:
        return int(model.num_classes)

    def validate_checkpoint(self, metadata: dict[str, Any], bad: Callable[[str, str], Exception]) -> None:
        validate_classifier_metadata(metadata, bad)

    def rebuild_checkpoint(self, metadata: dict[str, Any], state: dict[str, torch.Tensor],
                           source: str) -> Classifier:
        return checkpoint_classifier(metadata, state, source)
