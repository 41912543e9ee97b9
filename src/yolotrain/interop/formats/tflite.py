"""LiteRT (``.tflite``), converted from the PyTorch module with litert-torch, fixed at batch 1 and the
export's size: fp16 weights (float32 compute), int8 weights and activations via the AI Edge Quantizer
(the head's convolutions and decode tail in float). The metadata is a small archive appended to the
flatbuffer: first ``meta.txt``, the fields other tools read as the reference writes them (a Python literal,
which its ``DetectMultiBackend`` and ultralytics' ``AutoBackend`` read from the archive's first entry),
then ours in ``yolotrain.json``. :class:`TfliteModel` runs it with LiteRT's interpreter."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ...checkpoint import CheckpointError
from ..exporting.calibration import TFLITE_FLOAT_SCOPES, TfliteCalibrationInputs
from ..runtime import ExportedModel
from . import ExportFormat, export_metadata_of
from ._common import MAX_METADATA_BYTES, ExportJob, staged

EXTRA = "pip install 'yolotrain[tflite]'"
# The export appends a small zip archive holding this file to the flatbuffer: the interpreter reads
# the flatbuffer by offsets from its start and ignores trailing bytes.
METADATA_NAME = "yolotrain.json"
# The reference's name for its metadata entry; other tools read whichever entry comes first.
TOOLS_METADATA_NAME = "meta.txt"


def write(job: ExportJob) -> None:
    try:
        import litert_torch
    except ImportError:
        raise ImportError(f"LiteRT export needs 'litert-torch' ({EXTRA})") from None
    with staged(job.out) as path, contextlib.redirect_stdout(sys.stderr):  # the converter prints progress
        litert_torch.convert(job.graph, (job.example,)).export(str(path))
        if job.half or job.calibration is not None:
            _tflite_quantized(path, job.calibration)
        append_metadata(path, job.metadata, job.interop_metadata)


def append_metadata(path: Path, metadata: dict[str, str], interop_metadata: dict[str, Any]) -> None:
    """Append the metadata archive to the flatbuffer at ``path``: the other tools' entry first, then ours."""
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(TOOLS_METADATA_NAME, repr(interop_metadata))
        archive.writestr(METADATA_NAME, json.dumps(metadata))


def read_metadata(path: Path) -> dict[str, str]:
    """The metadata archive appended to a ``.tflite`` export."""
    with zipfile.ZipFile(path) as archive:
        if archive.getinfo(METADATA_NAME).file_size > MAX_METADATA_BYTES:
            return {}
        return json.loads(archive.read(METADATA_NAME))


def _tflite_quantized(path: Path, calibration: Any) -> None:
    """Rewrite the float LiteRT model at ``path`` with fp16 weights (``calibration`` None) or int8 weights
    and activations calibrated on ``calibration``, the head's convolutions and decode tail in float."""
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import qtyping, quantizer
    from ai_edge_quantizer.algorithm_manager import AlgorithmName

    every_op = qtyping.TFLOperationName.ALL_SUPPORTED
    model = quantizer.Quantizer(path.read_bytes())
    if calibration is None:
        model.add_weight_only_config(regex=".*", operation_name=every_op, num_bits=16,
                                     algorithm_key=AlgorithmName.FLOAT_CASTING)
        ranges = None
    else:
        model.add_static_config(regex=".*", operation_name=every_op, activation_num_bits=8, weight_num_bits=8)
        model.update_quantization_recipe(regex=TFLITE_FLOAT_SCOPES, operation_name=every_op,
                                         algorithm_key=AlgorithmName.NO_QUANTIZE)
        signature, inputs = next(iter(Interpreter(model_path=str(path)).get_signature_list().items()))
        (name,) = inputs["inputs"]
        with warnings.catch_warnings():  # calibration keeps every tensor on purpose; its interpreter warns about that
            warnings.filterwarnings("ignore", message=".*experimental_preserve_all_tensors")
            ranges = model.calibrate({signature: TfliteCalibrationInputs(calibration, name)},
                                     num_threads=os.cpu_count())
    result = model.quantize(ranges, enable_progress_report=False)
    path.unlink()
    result.export_model(str(path))


def read_tflite_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The metadata appended to a ``.tflite`` export (empty when there is none)."""
    return export_metadata_of(path, FORMAT) or {}


class TfliteModel(ExportedModel):
    """A ``.tflite`` file written by :func:`~yolotrain.interop.exporting.exporter.export`, run with LiteRT's
    interpreter.

    Inputs are NCHW float32 like the other formats (the converter keeps PyTorch's layout); an int8
    export's integer input is fed the images on its quantization grid. The interpreter's shapes are
    fixed, so batches run one image at a time.
    """

    format_name = "LiteRT"

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            raise ImportError(f"LiteRT models need the 'ai-edge-litert' package ({EXTRA})") from None
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


FORMAT = ExportFormat(name="tflite", suffix=".tflite", title="LiteRT", write=write, read_metadata=read_metadata,
                      half=True, int8=True,
                      runtime=TfliteModel, extra=EXTRA)
