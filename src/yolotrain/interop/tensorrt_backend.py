"""TensorRT engines (``.engine``): built from the ONNX export on a CUDA GPU, run there behind the call
shape of :class:`Yolov5`.

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

import numpy as np
import torch

from ..checkpoint import CheckpointError
from .formats.engine import tensorrt_unavailable
from .runtime import ExportedModel
from .trust import require_trust


class TensorRtModel(ExportedModel):
    """An engine written by :func:`~yolotrain.interop.export.export`, run on the current CUDA device.

    Inputs and outputs are float32 torch CUDA tensors whose addresses are handed to the engine; batches
    larger than the engine's largest run in chunks. An engine is native code: it is refused unless
    ``trust_code`` (see :mod:`.trust`).
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
