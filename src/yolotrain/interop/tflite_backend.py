"""Run an exported LiteRT (TFLite) detector with the LiteRT interpreter behind the call shape of :class:`Yolov5`."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..checkpoint import CheckpointError
from .formats import export_metadata_of
from .formats.tflite import FORMAT
from .runtime import ExportedModel

TFLITE_HINT = "pip install 'yolotrain[tflite]'"


def read_tflite_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The metadata appended to a ``.tflite`` export (empty when there is none)."""
    return export_metadata_of(path, FORMAT) or {}


class TfliteModel(ExportedModel):
    """A ``.tflite`` file written by :func:`~yolotrain.interop.export.export`, run with LiteRT's interpreter.

    Inputs are NCHW float32 like the other formats (the converter keeps PyTorch's layout); an int8
    export's integer input is fed the images on its quantization grid. The interpreter's shapes are
    fixed, so batches run one image at a time.
    """

    format_name = "LiteRT"

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            raise ImportError(f"LiteRT models need the 'ai-edge-litert' package ({TFLITE_HINT})") from None
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        try:
            self.interpreter = Interpreter(model_path=str(path), num_threads=threads or os.cpu_count())
            self.interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: not a loadable LiteRT model ({str(exc).splitlines()[0]})") from None
        self.input = self.interpreter.get_input_details()[0]
        self.outputs = self.interpreter.get_output_details()
        super().__init__(path, read_tflite_metadata(path), [int(s) for s in self.input["shape"]])

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        self.interpreter.set_tensor(self.input["index"], _quantize(images, self.input))
        self.interpreter.invoke()
        return [_dequantize(self.interpreter.get_tensor(o["index"]), o) for o in self.outputs]


def _quantize(values: np.ndarray, tensor: dict) -> np.ndarray:
    """``values`` in the dtype of an interpreter tensor: as they are for float, on its integer grid
    (``value / scale + zero_point``, rounded and clipped) for an int8 export's integer input."""
    dtype = tensor["dtype"]
    if np.issubdtype(dtype, np.floating):
        return values.astype(dtype, copy=False)
    scale, zero_point = tensor["quantization"]
    limits = np.iinfo(dtype)
    return np.clip(np.round(values / scale + zero_point), limits.min, limits.max).astype(dtype)


def _dequantize(values: np.ndarray, tensor: dict) -> np.ndarray:
    """float32 values of an interpreter output (integer outputs scaled back)."""
    if np.issubdtype(values.dtype, np.floating):
        return values.astype(np.float32, copy=False)
    scale, zero_point = tensor["quantization"]
    return (values.astype(np.float32) - zero_point) * np.float32(scale)
