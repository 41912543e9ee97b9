"""TensorRT engine (``.engine``), built from the traced ONNX graph on the current CUDA device: fp16 layers
(the decode tail in float32), dynamic batch and image size. An engine is compiled code, so loading one
needs the user's trust (:mod:`..trust`)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch

from ..calibration import onnx_decode_tail
from . import ExportFormat
from ._common import MAX_METADATA_BYTES, ExportJob, onnx_proto, staged

# Largest batch an engine with a dynamic batch axis accepts (val's default batch size); bigger batches
# run in chunks of this many.
MAX_BATCH = 32
WORKSPACE_BYTES = 4 << 30


def tensorrt_unavailable() -> str | None:
    """Why TensorRT engines cannot be built or run here (a missing package or no CUDA GPU), or None."""
    missing = []
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        missing.append("the 'tensorrt' package is not installed (pip install 'yolotrain[tensorrt]')")
    if not torch.cuda.is_available():
        missing.append("no CUDA GPU is visible to torch")
    if not missing:
        return None
    return ("TensorRT engines are built and run on a CUDA GPU with the 'tensorrt' package, and here "
            + " and ".join(missing))


def build_engine(proto: Any, out: Path, metadata: dict[str, str], half: bool, size: tuple[int, int],
                 min_side: int, float_layers: list[str]) -> None:
    """Build an engine from the ONNX ``proto`` and write it with ``metadata`` to ``out``.

    Free axes get one optimization profile: batch 1 to :data:`MAX_BATCH`, height and width from
    ``min_side`` to ``size``, tuned for batch 1 at ``size``. With ``half``, layers may run in fp16
    except ``float_layers`` (the decode tail, whose pixel coordinates fp16 would round).
    """
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(proto.SerializeToString()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ValueError(f"TensorRT cannot parse the exported ONNX graph: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    # TensorRT would run float32 convolutions as TF32 (10-bit mantissa) on recent GPUs: fp32 means fp32.
    config.clear_flag(trt.BuilderFlag.TF32)
    if half:
        config.set_flag(trt.BuilderFlag.FP16)
        config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
        keep = set(float_layers)
        for index in range(network.num_layers):
            layer = network.get_layer(index)
            if layer.name in keep:
                layer.precision = trt.float32
    images = network.get_input(0)
    shape = tuple(images.shape)
    lowest = tuple(d if d > 0 else (1 if axis == 0 else min_side) for axis, d in enumerate(shape))
    typical = tuple(d if d > 0 else (1 if axis == 0 else size[axis - 2]) for axis, d in enumerate(shape))
    highest = tuple(d if d > 0 else (MAX_BATCH if axis == 0 else size[axis - 2]) for axis, d in enumerate(shape))
    profile = builder.create_optimization_profile()
    profile.set_shape(images.name, lowest, typical, highest)
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ValueError("TensorRT could not build the engine (its log above says why)")
    header = json.dumps(metadata).encode()
    with open(out, "wb") as file:
        file.write(struct.pack("<I", len(header)) + header)
        file.write(memoryview(serialized))


def write(job: ExportJob) -> None:
    proto = onnx_proto(job)
    with staged(job.out) as path:
        build_engine(proto, path, job.metadata, job.half, job.size, job.min_side,
                     onnx_decode_tail(proto) if job.half else [])


def read_metadata(path: Path) -> dict[str, str]:
    """The JSON header an engine export starts with (a 4-byte little-endian length, then the JSON)."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<I", file.read(4))
        if length > MAX_METADATA_BYTES:
            return {}
        return json.loads(file.read(length))


def unavailable() -> str | None:
    """Why no engine can be built here (no CUDA GPU, no tensorrt), or None."""
    reason = tensorrt_unavailable()
    return None if reason is None else f"{reason}: export --format onnx, or run this export on the GPU machine"


FORMAT = ExportFormat(name="engine", suffix=".engine", title="TensorRT", write=write,
                      read_metadata=read_metadata, half=True, dynamic=True,
                      exact_suffix=True, runtime=("tensorrt_backend", "TensorRtModel"),
                      runs_code="a TensorRT engine is compiled native code (and may embed plugin libraries) that "
                                "runs when it is loaded",
                      unavailable=unavailable, extra="pip install 'yolotrain[tensorrt]'")
