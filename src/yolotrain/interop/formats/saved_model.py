"""TensorFlow SavedModel (a ``*_saved_model`` folder), converted by onnx2tf from the traced ONNX graph (see
:mod:`._tensorflow`): the decoded outputs of every task, fixed at batch 1 and the export's size, float32, with an
NHWC input as TensorFlow, TF Serving and TF.js's converter take it. :class:`SavedModelModel` runs its
``serving_default`` signature with TensorFlow.

The folder holds our metadata (``yolotrain.json``) and the fields ultralytics' ``AutoBackend`` reads from a
SavedModel folder (``metadata.yaml``). A TensorFlow graph is a program (its operations can read and write files),
so loading one needs the user's trust (:mod:`..trust`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import yaml

from ...checkpoint import CheckpointError
from ..exporting.graph import BOXES, LOGITS, MASK_PROTOTYPES
from ..runtime import ExportedModel
from ..trust import require_trust
from . import ExportFormat
from ._common import ExportJob, json_metadata_or_empty, read_json_metadata, staged
from ._tensorflow import EXTRA, convert, tensorflow_module, to_channels_first, to_channels_last, unavailable

SUFFIX = "_saved_model"
# Our metadata, and the fields other tools read, inside the folder.
METADATA_FILE = "yolotrain.json"
TOOLS_METADATA_FILE = "metadata.yaml"
SIGNATURE = "serving_default"
RUNS_CODE = ("a TensorFlow graph is a program: its operations can read and write files and run whatever "
             "TensorFlow can")


def write(job: ExportJob) -> None:
    with staged(job.out) as path:
        convert(job, "keras_saved_model" if job.keras else "saved_model", path)
        (path / METADATA_FILE).write_text(json.dumps(job.metadata), encoding="utf-8")
        (path / TOOLS_METADATA_FILE).write_text(
            yaml.safe_dump(job.interop_metadata, sort_keys=False, allow_unicode=True), encoding="utf-8")


def read_metadata(path: Path) -> dict[str, str]:
    """Our metadata, from the JSON file in the SavedModel folder."""
    return read_json_metadata(path / METADATA_FILE)


def output_order(name: str) -> tuple[int, str]:
    """Sort key of the signature's outputs ``output0``, ``output1`` ... (``output10`` after ``output9``)."""
    return len(name), name


class SavedModelModel(ExportedModel):
    """A SavedModel written by :func:`~yolotrain.interop.exporting.exporter.export`, run by TensorFlow on the CPU,
    one image at a time at the export's size. Refused unless ``trust_code`` (see :mod:`..trust`)."""

    format_name = "TensorFlow SavedModel"

    def __init__(self, path: str | os.PathLike, trust_code: bool = False) -> None:
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: no such SavedModel folder")
        require_trust(path, trust_code)
        metadata = json_metadata_or_empty(path / METADATA_FILE)
        size = json.loads(metadata["img_size"]) if "img_size" in metadata else [None, None]
        super().__init__(path, metadata, [1, 3, *size])
        tf = tensorflow_module()
        try:
            self._serve = tf.saved_model.load(str(path)).signatures[SIGNATURE]
        except (OSError, ValueError, KeyError, tf.errors.OpError) as exc:
            raise CheckpointError(f"{path}: not a loadable SavedModel ({str(exc).strip().splitlines()[0]})") from None
        self._tf = tf

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        outputs = self._serve(images=self._tf.constant(to_channels_last(images)))
        return to_channels_first([outputs[name].numpy() for name in sorted(outputs, key=output_order)])


FORMAT = ExportFormat(name="saved_model", suffix=SUFFIX, title="TensorFlow SavedModel", write=write,
                      read_metadata=read_metadata, outputs=frozenset({BOXES, MASK_PROTOTYPES, LOGITS}),
                      exact_suffix=True, keras=True, runtime=SavedModelModel, runs_code=RUNS_CODE,
                      unavailable=unavailable, extra=EXTRA)
