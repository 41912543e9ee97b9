"""Interoperability: official YOLOv5 checkpoints (read without running pickled code), export to deployment
formats and the runtimes that run those exports."""

from .backends import load_exported
from .export import add_export_arguments, export, run_export
from .official import UnsupportedCheckpointError
from .onnx_backend import OnnxModel
from .pretrained import load_checkpoint, load_model
from .resolve import resolve_model, resolve_trainable
from .runtime import ExportedModel
from .unpickler import UnsafeCheckpointError, read_torch_file

__all__ = ["ExportedModel", "OnnxModel", "UnsafeCheckpointError", "UnsupportedCheckpointError", "add_export_arguments",
           "export", "load_checkpoint", "load_exported", "load_model", "read_torch_file", "resolve_model",
           "resolve_trainable", "run_export"]
