"""TensorRT engine (``.engine``), built from the traced ONNX graph on the current CUDA device: fp16 layers
(the decode tail in float32), dynamic batch and image size. An engine is compiled code, so loading one
needs the user's trust (:mod:`..trust`). :class:`TensorRtModel` runs it on the GPU.

An engine file is the export's metadata (a 4-byte little-endian length, then that many bytes of JSON)
followed by the serialized engine. Engines are specific to the GPU and TensorRT version that built
them, so they are built on the machine that runs them. Written for the TensorRT 10 Python API
(named I/O tensors, ``execute_async_v3``) with torch CUDA tensors as buffers.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...checkpoint import CheckpointError
from ..exporting.calibration import onnx_decode_tail
from ..runtime import ExportedModel
from ..trust import require_trust
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


class TensorRtModel(ExportedModel):
    """An engine written by :func:`~yolotrain.interop.exporting.exporter.export`, run on the current CUDA device.

    Inputs and outputs are float32 torch CUDA tensors whose addresses are handed to the engine; batches
    larger than the engine's largest run in chunks. An engine is native code: it is refused unless
    ``trust_code`` (see :mod:`..trust`).
    """

    format_name = "TensorRT"

    def __init__(self, path: str | os.PathLike, trust_code: bool = False) -> None:
        path = Path(path)
        require_trust(path, trust_code)
        reason = tensorrt_unavailable()
        if reason is not None:
            raise CheckpointError(f"{path}: {reason} (run it on the GPU machine that built it)")
        import tensorrt as trt

        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        data = path.read_bytes()
        try:
            (length,) = struct.unpack("<I", data[:4])
            metadata = json.loads(data[4:4 + length])
        except (struct.error, UnicodeDecodeError, ValueError):
            raise CheckpointError(f"{path}: TensorRT file without yolotrain metadata "
                                  "(export it with yolotrain export)") from None
        self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(data[4 + length:])
        if self.engine is None:
            raise CheckpointError(f"{path}: not an engine this GPU and TensorRT version can load "
                                  "(engines are built on the machine that runs them)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_name = next(n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT)
        self.output_names = [n for n in names if n != self.input_name]
        shape = list(self.engine.get_tensor_shape(self.input_name))
        self.max_batch = shape[0] if shape[0] > 0 else self.engine.get_tensor_profile_shape(self.input_name, 0)[2][0]
        self.cuda_device = torch.device("cuda", torch.cuda.current_device())
        super().__init__(path, metadata, shape)

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        chunks = []
        stream = torch.cuda.current_stream(self.cuda_device)
        for start in range(0, len(images), self.max_batch):
            batch = torch.from_numpy(images[start:start + self.max_batch]).to(self.cuda_device).contiguous()
            if not self.context.set_input_shape(self.input_name, tuple(batch.shape)):
                lowest, _, highest = self.engine.get_tensor_profile_shape(self.input_name, 0)
                raise ValueError(f"{self.path.name} takes images from {list(lowest)} to {list(highest)}, "
                                 f"got {list(batch.shape)}")
            self.context.set_tensor_address(self.input_name, batch.data_ptr())
            outputs = []
            for name in self.output_names:
                output = torch.empty(tuple(self.context.get_tensor_shape(name)), dtype=torch.float32,
                                     device=self.cuda_device)
                self.context.set_tensor_address(name, output.data_ptr())
                outputs.append(output)
            if not self.context.execute_async_v3(stream.cuda_stream):
                raise ValueError(f"{self.path.name}: TensorRT failed to run a batch of shape {list(batch.shape)}")
            stream.synchronize()
            chunks.append([o.cpu().numpy() for o in outputs])
        return [np.concatenate(parts) for parts in zip(*chunks)]


FORMAT = ExportFormat(name="engine", suffix=".engine", title="TensorRT", write=write,
                      read_metadata=read_metadata, half=True, dynamic=True,
                      exact_suffix=True, runtime=TensorRtModel,
                      runs_code="a TensorRT engine is compiled native code (and may embed plugin libraries) that "
                                "runs when it is loaded",
                      unavailable=unavailable, extra="pip install 'yolotrain[tensorrt]'")
