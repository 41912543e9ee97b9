"""TensorRT engine (``.engine``), built from the traced ONNX graph on the current CUDA device: fp16 layers
(the decode tail in float32), dynamic batch and image size. An engine is compiled code, so loading one
needs the user's trust (:mod:`..trust`)."""

from __future__ import annotations

from . import ExportFormat
from ._common import ExportJob, onnx_proto, staged


def write(job: ExportJob) -> None:
    from ..calibration import onnx_decode_tail
    from ..tensorrt_backend import build_engine

    proto = onnx_proto(job)
    with staged(job.out) as path:
        build_engine(proto, path, job.metadata, job.half, job.size, job.min_side,
                     onnx_decode_tail(proto) if job.half else [])


def unavailable() -> str | None:
    """Why no engine can be built here (no CUDA GPU, no tensorrt), or None."""
    from ..tensorrt_backend import tensorrt_unavailable

    reason = tensorrt_unavailable()
    return None if reason is None else f"{reason}: export --format onnx, or run this export on the GPU machine"


FORMAT = ExportFormat(name="engine", suffix=".engine", title="TensorRT", write=write, half=True, dynamic=True,
                      exact_suffix=True, runtime=("tensorrt_backend", "TensorRtModel"),
                      runs_code="a TensorRT engine is compiled native code (and may embed plugin libraries) that "
                                "runs when it is loaded",
                      unavailable=unavailable, extra="pip install 'yolotrain[tensorrt]'")
