"""ExecuTorch (``.pte``), PyTorch's runtime for phones and embedded devices: the graph captured by
``torch.export`` and lowered to XNNPACK's CPU kernels, the decoded outputs of every task, fixed at batch 1 and the
export's size, float32. :class:`ExecuTorchModel` runs it with the ``executorch`` package's runtime.

A program file has no place for metadata, so ours is a JSON file beside it (``.pte.json``), and the fields other
tools read are the ``metadata.yaml`` that ultralytics' ``AutoBackend`` reads from a folder named
``*_executorch_model`` (written when the export is the one model of such a folder, as for NCNN). A program names
operators of the runtime's own kernel library: loading one runs no code it carries."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import warnings
from pathlib import Path

import numpy as np
import torch
import yaml

from ...atomic import write_atomic
from ...checkpoint import CheckpointError
from ..exporting.graph import BOXES, LOGITS, MASK_PROTOTYPES
from ..runtime import ExportedModel
from . import ExportFormat
from ._common import ExportJob, metadata_beside, quiet_output, read_json_metadata, staged

EXTRA = "pip install 'yolotrain[executorch]'"
SUFFIX = ".pte"
METADATA_SUFFIX = ".pte.json"
# A folder of one ExecuTorch model as ultralytics names it, and its metadata file in it.
MODEL_FOLDER_SUFFIX = "_executorch_model"
FOLDER_METADATA = "metadata.yaml"


def _unavailable() -> str | None:
    # Looked up, not imported: importing its compiler takes seconds.
    if importlib.util.find_spec("executorch") is None:
        return f"ExecuTorch export needs the 'executorch' package ({EXTRA})"
    return None


def write(job: ExportJob) -> None:
    if (missing := _unavailable()) is not None:
        raise ImportError(missing)
    # Importing the lowering registers an enum with torch's pytree, which logs a deprecation meant for its authors.
    pytree_log = logging.getLogger("torch.utils._pytree")
    level = pytree_log.level
    pytree_log.setLevel(logging.ERROR)
    try:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower
    finally:
        pytree_log.setLevel(level)

    with torch.no_grad():
        captured = torch.export.export(job.graph, (job.example,), strict=False)
        program = to_edge_transform_and_lower(captured, partitioner=[XnnpackPartitioner()]).to_executorch()
    with staged(job.out, ("", METADATA_SUFFIX)) as path:
        path.write_bytes(program.buffer)
        path.with_suffix(METADATA_SUFFIX).write_text(json.dumps(job.metadata), encoding="utf-8")
    if _is_model_folder(job.out):
        tools_metadata = yaml.safe_dump(job.interop_metadata, sort_keys=False, allow_unicode=True)
        write_atomic(job.out.parent / FOLDER_METADATA, lambda file: file.write_text(tools_metadata, encoding="utf-8"))


def _is_model_folder(out: Path) -> bool:
    """Whether ``out``'s folder is the folder of this one model, as ultralytics lays one out."""
    return out.parent.name.endswith(MODEL_FOLDER_SUFFIX) and all(
        program.name == out.name for program in out.parent.glob(f"*{SUFFIX}"))


def read_metadata(path: Path) -> dict[str, str]:
    """Our metadata, from the JSON file beside the program."""
    return read_json_metadata(path.with_suffix(METADATA_SUFFIX))


class ExecuTorchModel(ExportedModel):
    """An ExecuTorch program written by :func:`~yolotrain.interop.exporting.exporter.export`, run by the
    ``executorch`` runtime with XNNPACK on the CPU, one image at a time at the export's size."""

    format_name = "ExecuTorch"

    def __init__(self, path: str | os.PathLike) -> None:
        path = Path(path)
        metadata = metadata_beside(path, ((path.with_suffix(METADATA_SUFFIX), "metadata"),))
        try:
            with warnings.catch_warnings():  # the runtime's Python API calls itself experimental, at each import
                warnings.filterwarnings("ignore", message="This API is experimental")
                from executorch.runtime import Runtime
        except ImportError:
            raise ImportError(f"ExecuTorch models need the 'executorch' package ({EXTRA})") from None
        try:
            # The runtime's CPU probe prints notes from compiled code; they stay off the program's output.
            with quiet_output():
                self.method = Runtime.get().load_program(str(path)).load_method("forward")
        except (RuntimeError, ValueError) as exc:
            raise CheckpointError(f"{path}: not a loadable ExecuTorch program ({str(exc).strip().splitlines()[0]})"
                                  ) from None
        info = self.method.metadata
        input_shape = list(info.input_tensor_meta(0).sizes())
        output_shapes = [list(info.output_tensor_meta(i).sizes()) for i in range(info.num_outputs())]
        super().__init__(path, metadata, input_shape, output_shapes)

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        with quiet_output():
            outputs = self.method.execute([torch.from_numpy(np.ascontiguousarray(images))])
        return [output.numpy() for output in outputs]


FORMAT = ExportFormat(name="executorch", suffix=SUFFIX, title="ExecuTorch", write=write, read_metadata=read_metadata,
                      outputs=frozenset({BOXES, MASK_PROTOTYPES, LOGITS}), companions=(METADATA_SUFFIX,),
                      exact_suffix=True, runtime=ExecuTorchModel, unavailable=_unavailable, extra=EXTRA)
