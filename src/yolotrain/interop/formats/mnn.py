"""MNN (``.mnn``), Alibaba's inference engine for phones and embedded devices, converted by MNN's converter from
the traced ONNX graph: the decoded outputs of every task, fixed at batch 1 and the export's size, fp32 or fp16
weights. :class:`MnnModel` runs it with the ``MNN`` Python package.

The metadata, ours and the fields ultralytics' ``AutoBackend`` reads, is the model's ``bizCode`` string (JSON), where
both read it. The converter runs in a child process through MNN's compiled ``_tools`` module alone: the Python
wrapper around it (``MNN.tools``) reports every conversion to a remote log service and installs a package for it,
which an export must not do."""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from ...checkpoint import CheckpointError
from ..exporting.graph import BOXES, LOGITS, MASK_PROTOTYPES
from ..runtime import ExportedModel
from . import ExportFormat
from ._common import MAX_METADATA_BYTES, ExportJob, onnx_module, onnx_proto, quiet_output, run_converter, staged

EXTRA = "pip install 'yolotrain[mnn]'"
# The child process that converts: MNN's compiled converter, given its command line (it says "Converted Success!").
_CONVERT = "import sys, _tools; _tools.mnnconvert(sys.argv)"
# Where our metadata starts inside the bizCode JSON (json.dumps of the metadata, whose first key is this).
_MARKER = b'{"producer": "yolotrain"'


def _mnn_module():
    try:
        with quiet_output((1,)):
            import MNN
    except ImportError:
        raise ImportError(f"MNN models need the 'MNN' package ({EXTRA})") from None
    return MNN


def _unavailable() -> str | None:
    # MNN's converter, a compiled module installed with the MNN package (looked up, not imported: it prints).
    if importlib.util.find_spec("_tools") is None:
        return f"MNN export needs the 'MNN' package ({EXTRA})"
    return None


def write(job: ExportJob) -> None:
    if (missing := _unavailable()) is not None:
        raise ImportError(missing)
    onnx = onnx_module()
    proto = onnx_proto(job)
    metadata = json.dumps({"producer": job.metadata["producer"], **job.metadata})
    with tempfile.TemporaryDirectory(prefix="yolotrain-mnn-") as scratch, staged(job.out) as path:
        source = Path(scratch) / "model.onnx"
        onnx.save(proto, str(source))
        command = [sys.executable, "-c", _CONVERT, "-f", "ONNX", "--modelFile", str(source), "--MNNModel", str(path),
                   "--bizCode", metadata] + (["--fp16"] if job.half else [])
        # In the scratch folder: the converter leaves a file of external data in its working folder.
        run_converter(command, "MNN's converter could not convert the model",
                      lambda printed: path.is_file() and "Converted Success" in printed, Path(scratch))


def read_metadata(path: Path) -> dict[str, str]:
    """Our metadata, found in the model file as data: the bizCode string is stored as its length (4 bytes, little
    endian) then its JSON text, which starts with our producer key."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        start = data.find(_MARKER)
        if start < 4:
            return {}
        length = int.from_bytes(data[start - 4:start], "little")
        if length > MAX_METADATA_BYTES or start + length > len(data):
            return {}
        return json.loads(data[start:start + length].decode("utf-8"))


class MnnModel(ExportedModel):
    """An MNN model written by :func:`~yolotrain.interop.exporting.exporter.export`, run by the ``MNN`` package on the
    CPU in float32 ("high" precision: MNN's "low" computes in half precision where the CPU can), one image at a
    time at the export's size."""

    format_name = "MNN"

    def __init__(self, path: str | os.PathLike) -> None:
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        mnn = _mnn_module()
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        try:
            with quiet_output((1,)):
                runtime = mnn.nn.create_runtime_manager(({"precision": "high", "backend": "CPU",
                                                          "numThread": threads},))
                self.net = mnn.nn.load_module_from_file(str(path), [], [], runtime_manager=runtime, rearrange=True)
            info = self.net.get_info()
        except Exception as exc:  # noqa: BLE001 - MNN raises plain exceptions with its own texts
            raise CheckpointError(f"{path}: not a loadable MNN model ({str(exc).strip().splitlines()[0]})") from None
        try:
            metadata = json.loads(info.get("bizCode") or "{}")
        except json.JSONDecodeError:
            metadata = {}
        if not isinstance(metadata, dict):
            metadata = {}
        self._expr = mnn.expr
        size = json.loads(metadata["img_size"]) if "img_size" in metadata else [None, None]
        super().__init__(path, metadata, [1, 3, *size])

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        image = self._expr.const(np.ascontiguousarray(images), list(images.shape), self._expr.NCHW)
        outputs = self.net.onForward([image])
        if not outputs:
            raise RuntimeError("MNN returned no outputs")
        return [np.array(output.read(), copy=True) for output in outputs]


FORMAT = ExportFormat(name="mnn", suffix=".mnn", title="MNN", write=write, read_metadata=read_metadata, half=True,
                      outputs=frozenset({BOXES, MASK_PROTOTYPES, LOGITS}), exact_suffix=True, runtime=MnnModel,
                      unavailable=_unavailable, extra=EXTRA)
