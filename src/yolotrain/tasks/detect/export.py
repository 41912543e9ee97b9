"""Detection's exports, runtimes and checkpoints: decoded boxes (or the raw head maps, or final detections with
NMS inside); the architecture fields of exports and checkpoints, and the rebuild, are the model's family's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...family import family_of
from ...interop.exporting.graph import BOXES, ExportGraph
from ...interop.runtime import ExportedModel, differs, output_shape_mismatch, shape_text
from ...model.layered import DEFAULT_IMG_SIZE


class DetectExport:
    """Detection's answers about export, exported runtimes and checkpoints (segmentation inherits them)."""

    export_outputs: tuple[str, ...] = (BOXES,)

    def export_format_refusal(self, fmt: str, supported: Sequence[str]) -> str:
        return f"detection models export to {', '.join(supported)}, not {fmt}"

    def check_export_options(self, half: bool, int8: bool, raw: bool, nms: bool) -> None:
        """A detector's exports have every option its format offers."""

    def export_metadata(self, model: Any) -> dict[str, str]:
        return family_of(model).export_metadata(model)

    def trace_export(self, graph: ExportGraph, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        maps = graph.model.forward_maps(images)
        if graph.raw:
            return tuple(maps)
        decoded = graph.model.head.decode(maps)
        return decoded if graph.nms is None else graph.detections(decoded)

    def exported_metadata_problem(self, raw: bool, nms: bool) -> str | None:
        return None

    def exported_output_mismatch(self, runtime: ExportedModel, shapes: Sequence[Sequence[int | None]],
                                 input_hw: Sequence[int | None]) -> str | None:
        if runtime.end_to_end:
            return output_shape_mismatch(shapes, [None, runtime.nms_settings["max_det"], 6],
                                         f"nms max_det {runtime.nms_settings['max_det']}")
        na, no = runtime.anchors_per_level, runtime.num_classes + 5 + runtime.num_masks
        strides = [int(s) for s in runtime.stride.tolist()]
        height, width = input_hw
        grids = [(height // s, width // s) if height is not None and width is not None else (None, None)
                 for s in strides]
        if runtime.raw:
            if len(shapes) != len(strides):
                return f"{len(strides)} strides {strides} mean {len(strides)} raw outputs, it has {len(shapes)}"
            for level, (shape, (gh, gw)) in enumerate(zip(shapes, grids)):
                expected = [None, na, gh, gw, no]
                if len(shape) != 5 or any(differs(g, e) for g, e in zip(shape, expected)):
                    return (f"level {level} (stride {strides[level]}, {na} anchors, nc {runtime.num_classes}) means "
                            f"maps of {shape_text(expected)}, it gives {shape_text(shape)}")
            return None
        cells = None if None in grids[0] else sum(gh * gw for gh, gw in grids)
        return output_shape_mismatch(
            shapes, [None, None if cells is None else na * cells, no],
            f"strides {strides}, {na} anchors per level and nc {runtime.num_classes}"
            + (f" (nm {runtime.num_masks})" if runtime.num_masks else ""))

    def exported_default_img_size(self, runtime: ExportedModel) -> int:
        return runtime.img_size[0] if not runtime.dynamic_size else DEFAULT_IMG_SIZE.get(runtime.max_stride, 640)

    def checkpoint_architecture(self, model: Any) -> dict[str, Any]:
        return family_of(model).checkpoint_architecture(model)

    def checkpoint_num_classes(self, model: Any) -> int:
        return int(model.head.nc)

    def validate_checkpoint(self, metadata: dict[str, Any], bad: Callable[[str, str], Exception]) -> None:
        family_of(metadata).validate_checkpoint(metadata, bad)

    def rebuild_checkpoint(self, metadata: dict[str, Any], state: dict[str, torch.Tensor], source: str) -> Any:
        return family_of(metadata).rebuild_checkpoint(metadata, state, source)
