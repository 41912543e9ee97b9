"""Interoperability: official YOLOv5 checkpoints (read without running pickled code), ONNX/TorchScript export."""

from .export import add_export_arguments, export, run_export
from .official import UnsupportedCheckpointError
from .onnx_backend import OnnxModel
from .pretrained import load_checkpoint, load_model
from .unpickler import UnsafeCheckpointError, read_torch_file

__all__ = ["OnnxModel", "UnsafeCheckpointError", "UnsupportedCheckpointError", "add_export_arguments", "export",
           "load_checkpoint", "load_model", "read_torch_file", "run_export"]
