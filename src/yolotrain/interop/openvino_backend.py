"""Run an exported OpenVINO IR (``.xml`` + ``.bin``) detector on the CPU behind the call shape of :class:`Yolov5`."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..checkpoint import CheckpointError
from .runtime import ExportedModel

OPENVINO_HINT = "pip install 'yolotrain[openvino]'"
# Where the export keeps its metadata inside the IR's runtime info.
RT_INFO_SECTION = "yolotrain"


def openvino_module():
    try:
        import openvino
    except ImportError:
        raise ImportError(f"OpenVINO models need the 'openvino' package ({OPENVINO_HINT})") from None
    return openvino


class OpenVinoModel(ExportedModel):
    """An OpenVINO IR written by :func:`~yolotrain.interop.export.export`, compiled for the CPU.

    The CPU plugin would pick bfloat16 arithmetic on CPUs that have it; fp32 and int8 exports are
    compiled with float32 as the inference precision so they compute what PyTorch computes, fp16
    exports with float16 where the CPU supports it.
    """

    format_name = "OpenVINO"

    def __init__(self, path: str | os.PathLike) -> None:
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        if not path.with_suffix(".bin").is_file():
            raise CheckpointError(f"{path}: its weights file {path.with_suffix('.bin').name} is missing")
        ov = openvino_module()
        core = ov.Core()
        try:
            model = core.read_model(str(path))
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises plain RuntimeErrors with multi-line text
            raise CheckpointError(f"{path}: not a loadable OpenVINO model ({str(exc).splitlines()[0]})") from None
        section = model.get_rt_info([RT_INFO_SECTION]).astype(dict) if model.has_rt_info([RT_INFO_SECTION]) else {}
        metadata = {key: str(value.astype(str)) for key, value in section.items()}
        shape = model.inputs[0].get_partial_shape()
        super().__init__(path, metadata, [d.get_length() if d.is_static else None for d in shape])
        precision = "f16" if self.precision == "fp16" and "FP16" in core.get_property(
            "CPU", "OPTIMIZATION_CAPABILITIES") else "f32"
        self.compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": precision})
        self.request = self.compiled.create_infer_request()

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        self.request.infer({0: images})
        return [self.request.get_output_tensor(i).data.copy() for i in range(len(self.compiled.outputs))]
