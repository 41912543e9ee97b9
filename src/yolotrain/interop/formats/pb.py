"""TensorFlow GraphDef (``.pb``), the frozen graph (weights as constants) of the model onnx2tf converts from the
traced ONNX graph (see :mod:`._tensorflow`), for TensorFlow 1-style tools: the decoded outputs of every task, fixed
at batch 1 and the export's size, float32, NHWC input ``images``. :class:`GraphDefModel` runs it with TensorFlow.

A GraphDef has no place for metadata, so ours is a JSON file beside it (``.pb.json``). A TensorFlow graph is a
program (its operations can read and write files), so loading one needs the user's trust (:mod:`..trust`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ...checkpoint import CheckpointError
from ..exporting.graph import BOXES, LOGITS, MASK_PROTOTYPES
from ..runtime import ExportedModel
from ..trust import require_trust
from . import ExportFormat
from ._common import ExportJob, metadata_beside, read_json_metadata, staged
from ._tensorflow import EXTRA, convert, tensorflow_module, to_channels_first, to_channels_last, unavailable
from .saved_model import RUNS_CODE

SUFFIX = ".pb"
METADATA_SUFFIX = ".pb.json"
INPUT_NAME = "images"


def write(job: ExportJob) -> None:
    with staged(job.out, ("", METADATA_SUFFIX)) as path:
        convert(job, "pb", path)
        path.with_suffix(METADATA_SUFFIX).write_text(json.dumps(job.metadata), encoding="utf-8")


def metadata_path(path: Path) -> Path:
    """The metadata file of the GraphDef ``path`` (``NAME.pb`` → ``NAME.pb.json``)."""
    return path.with_suffix(METADATA_SUFFIX)


def read_metadata(path: Path) -> dict[str, str]:
    """Our metadata, from the JSON file beside the GraphDef."""
    return read_json_metadata(metadata_path(path))


def output_names(graph_def) -> list[str]:
    """The graph's outputs (the frozen function's ``Identity``, ``Identity_1`` ... in order): the nodes no other
    node reads, but the graph's no-ops."""
    consumed = {name.lstrip("^").split(":")[0] for node in graph_def.node for name in node.input}
    found = [node.name for node in graph_def.node if node.name not in consumed and node.op != "NoOp"]
    return sorted(found, key=lambda name: (len(name), name))


class GraphDefModel(ExportedModel):
    """A frozen GraphDef written by :func:`~yolotrain.interop.exporting.exporter.export`, run by TensorFlow on the
    CPU, one image at a time at the export's size. Refused unless ``trust_code`` (see :mod:`..trust`)."""

    format_name = "TensorFlow GraphDef"

    def __init__(self, path: str | os.PathLike, trust_code: bool = False) -> None:
        path = Path(path)
        require_trust(path, trust_code)
        metadata = metadata_beside(path, ((metadata_path(path), "metadata"),))
        size = json.loads(metadata["img_size"]) if "img_size" in metadata else [None, None]
        super().__init__(path, metadata, [1, 3, *size])
        tf = tensorflow_module()
        graph_def = tf.compat.v1.GraphDef()
        try:
            graph_def.ParseFromString(path.read_bytes())
            outputs = output_names(graph_def)
            graph = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
            self._run_graph = graph.prune(feeds=f"{INPUT_NAME}:0", fetches=[f"{name}:0" for name in outputs])
        except Exception as exc:  # noqa: BLE001 - protobuf and TensorFlow raise their own error types
            raise CheckpointError(f"{path}: not a loadable TensorFlow GraphDef "
                                  f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
                                  ) from None
        self._tf = tf

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        outputs = self._run_graph(self._tf.constant(to_channels_last(images)))
        return to_channels_first([output.numpy() for output in outputs])


FORMAT = ExportFormat(name="pb", suffix=SUFFIX, title="TensorFlow GraphDef", write=write,
                      read_metadata=read_metadata, outputs=frozenset({BOXES, MASK_PROTOTYPES, LOGITS}),
                      companions=(METADATA_SUFFIX,), exact_suffix=True, runtime=GraphDefModel, runs_code=RUNS_CODE,
                      unavailable=unavailable, extra=EXTRA)
