"""Core ML (``.mlpackage``, an ML program), converted from the PyTorch module with coremltools, fixed at
batch 1 and the export's size; fp16 compute with ``half``. It runs on macOS only, so nothing here loads it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import warnings
from pathlib import Path

import torch

from ..exporting.graph import DECODED_OUTPUT, DETECTIONS_OUTPUT
from . import ExportFormat
from ._common import ExportJob, message_field, protobuf_field, protobuf_string_map, staged

EXTRA = "pip install 'yolotrain[coreml]'"
# Core ML's Model.description, ModelDescription.metadata and Metadata.userDefined (protobuf field numbers).
DESCRIPTION_FIELD, METADATA_FIELD, USER_DEFINED_FIELD = 2, 100, 100
# Largest model description read; it holds the inputs', outputs' and metadata's descriptions.
MAX_DESCRIPTION_BYTES = 16 << 20


def write(job: ExportJob) -> None:
    try:
        import coremltools as ct
    except ImportError:
        raise ImportError(f"Core ML export needs 'coremltools' ({EXTRA})") from None
    precision = ct.precision.FLOAT16 if job.half else ct.precision.FLOAT32
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        # coremltools warns that it was not tested with this torch version; the structure test covers it.
        warnings.simplefilter("ignore")
        logging.getLogger("coremltools").setLevel(logging.ERROR)
        program = torch.export.export(job.graph, (job.example,)).run_decompositions({})
        mlmodel = ct.convert(program, inputs=[ct.TensorType(name="images", shape=tuple(job.example.shape))],
                             outputs=[ct.TensorType(name=DETECTIONS_OUTPUT if job.graph.nms else DECODED_OUTPUT)],
                             convert_to="mlprogram", compute_precision=precision,
                             minimum_deployment_target=ct.target.iOS16)
    mlmodel.user_defined_metadata.update(job.metadata)
    mlmodel.short_description = f"yolotrain {job.metadata['model']} detector, {job.metadata['nc']} classes"
    with staged(job.out) as path:
        mlmodel.save(str(path))


def read_metadata(path: Path) -> dict[str, str]:
    """The user-defined metadata of an ``.mlpackage``, read from the model specification its
    ``Manifest.json`` names (without coremltools; the weights are not read)."""
    manifest = json.loads((path / "Manifest.json").read_text())
    spec = Path(manifest["itemInfoEntries"][manifest["rootModelIdentifier"]]["path"])
    if spec.is_absolute() or ".." in spec.parts:
        raise ValueError(f"{path}: its manifest names a model outside the package")
    with (path / "Data" / spec).open("rb") as file:
        descriptions = protobuf_field(file, DESCRIPTION_FIELD, os.fstat(file.fileno()).st_size, MAX_DESCRIPTION_BYTES)
    metadata = [m for description in descriptions for m in message_field(description, METADATA_FIELD)]
    return protobuf_string_map([entry for m in metadata for entry in message_field(m, USER_DEFINED_FIELD)])


FORMAT = ExportFormat(name="coreml", suffix=".mlpackage", title="Core ML", write=write,
                      read_metadata=read_metadata, half=True,
                      exact_suffix=True, extra=EXTRA,
                      not_runnable="yolotrain does not run Core ML models: Core ML prediction needs macOS "
                                   "(load the .mlpackage there with coremltools or Xcode)")
