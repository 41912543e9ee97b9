"""Interoperability: official YOLOv5 checkpoints (read without running pickled code), export to deployment
formats and the runtimes that run those exports.

:mod:`.loading` builds models from files, :mod:`.exporting` writes exports, :mod:`.formats` holds one module
per format with its writer and runtime backend; :mod:`.runtime` (the backends' base), :mod:`.backends`
(which backend runs a file) and :mod:`.trust` (files that run code when loaded) serve every format."""

from .backends import load_exported
from .exporting.exporter import add_export_arguments, export, run_export
from .formats.onnx import OnnxModel
from .loading.official import UnsupportedCheckpointError
from .loading.pretrained import load_checkpoint, load_model
from .loading.resolve import resolve_model, resolve_trainable
from .loading.unpickler import UnsafeCheckpointError, read_torch_file
from .runtime import ExportedModel

__all__ = ["ExportedModel", "OnnxModel", "UnsafeCheckpointError", "UnsupportedCheckpointError", "add_export_arguments",
           "export", "load_checkpoint", "load_exported", "load_model", "read_torch_file", "resolve_model",
           "resolve_trainable", "run_export"]
