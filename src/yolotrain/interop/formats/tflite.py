"""LiteRT (``.tflite``), converted from the PyTorch module with litert-torch, fixed at batch 1 and the
export's size: fp16 weights (float32 compute), int8 weights and activations via the AI Edge Quantizer
(the head's convolutions and decode tail in float). The metadata is a small archive appended to the
flatbuffer."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

from ..calibration import TFLITE_FLOAT_SCOPES, TfliteCalibrationInputs
from . import ExportFormat
from ._common import MAX_METADATA_BYTES, ExportJob, staged

EXTRA = "pip install 'yolotrain[tflite]'"
# The export appends a small zip archive holding this file to the flatbuffer: the interpreter reads
# the flatbuffer by offsets from its start and ignores trailing bytes.
METADATA_NAME = "yolotrain.json"


def write(job: ExportJob) -> None:
    try:
        import litert_torch
    except ImportError:
        raise ImportError(f"LiteRT export needs 'litert-torch' ({EXTRA})") from None
    with staged(job.out) as path, contextlib.redirect_stdout(sys.stderr):  # the converter prints progress
        litert_torch.convert(job.graph, (job.example,)).export(str(path))
        if job.half or job.calibration is not None:
            _tflite_quantized(path, job.calibration)
        with zipfile.ZipFile(path, "a") as archive:
            archive.writestr(METADATA_NAME, json.dumps(job.metadata))


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


FORMAT = ExportFormat(name="tflite", suffix=".tflite", title="LiteRT", write=write, read_metadata=read_metadata,
                      half=True, int8=True,
                      runtime=("tflite_backend", "TfliteModel"), extra=EXTRA)
