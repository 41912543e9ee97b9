"""NCNN (``.ncnn.param`` with its ``.ncnn.bin`` weights), Tencent's inference library for phones and embedded
CPUs, converted by PNNX from the traced TorchScript graph: the decoded outputs of every task, fixed at batch 1
and the export's size, fp32 or fp16 weights. :class:`NcnnModel` runs it with the ``ncnn`` Python package.

An NCNN model has no place for metadata, so ours is a JSON file beside it (``.ncnn.json``), and the fields
other tools read are the ``metadata.yaml`` that ultralytics' ``AutoBackend`` reads from a folder named
``*_ncnn_model`` (written when the export is the one model of such a folder, as for OpenVINO). An NCNN param
file names layers of the library's own set: loading one runs no code it carries."""

from __future__ import annotations

import json
import os
import tempfile
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
from ._common import ExportJob, metadata_beside, read_json_metadata, run_converter, staged

EXTRA = "pip install 'yolotrain[ncnn]'"
SUFFIX = ".ncnn.param"
WEIGHTS_SUFFIX = ".ncnn.bin"
METADATA_SUFFIX = ".ncnn.json"
# A folder of one NCNN model as ultralytics names it, and its metadata file in it.
MODEL_FOLDER_SUFFIX = "_ncnn_model"
FOLDER_METADATA = "metadata.yaml"
# PNNX's names for the graph's input and outputs (in0, out0, out1 ... in the traced outputs' order).
INPUT_NAME = "in0"


def _pnnx_executable() -> str:
    try:
        import pnnx
    except ImportError:
        raise ImportError(f"NCNN export needs PNNX, the converter ({EXTRA})") from None
    return pnnx.EXEC_PATH


def _ncnn_module():
    try:
        import ncnn
    except ImportError:
        raise ImportError(f"NCNN models need the 'ncnn' package ({EXTRA})") from None
    return ncnn


def write(job: ExportJob) -> None:
    executable = _pnnx_executable()
    tools_metadata = yaml.safe_dump(job.interop_metadata, sort_keys=False, allow_unicode=True)
    with tempfile.TemporaryDirectory(prefix="yolotrain-pnnx-") as scratch, \
            staged(job.out, ("", ".bin", ".json")) as path:
        work = Path(scratch)
        traced = work / "model.torchscript"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
            torch.jit.save(torch.jit.trace(job.graph, job.example, strict=False, check_trace=False), str(traced))
        shape = ",".join(str(s) for s in job.example.shape)
        # Every file PNNX writes goes to the scratch folder but the two the export keeps.
        command = [executable, str(traced), f"inputshape=[{shape}]f32", "device=cpu", f"fp16={int(job.half)}",
                   f"ncnnparam={path}", f"ncnnbin={path.with_suffix('.bin')}", f"ncnnpy={work / 'ncnn.py'}",
                   f"pnnxparam={work / 'model.pnnx.param'}", f"pnnxbin={work / 'model.pnnx.bin'}",
                   f"pnnxpy={work / 'pnnx.py'}", f"pnnxonnx={work / 'model.pnnx.onnx'}"]
        run_converter(command, "PNNX could not convert the model to NCNN",
                      lambda _: path.is_file() and path.with_suffix(".bin").is_file(), work)
        path.with_suffix(".json").write_text(json.dumps(job.metadata), encoding="utf-8")
    if _is_model_folder(job.out):
        write_atomic(job.out.parent / FOLDER_METADATA, lambda file: file.write_text(tools_metadata, encoding="utf-8"))


def _is_model_folder(out: Path) -> bool:
    """Whether ``out``'s folder is the folder of this one model, as ultralytics lays one out."""
    return out.parent.name.endswith(MODEL_FOLDER_SUFFIX) and all(
        param.name == out.name for param in out.parent.glob("*.param"))


def metadata_path(param: Path) -> Path:
    """The metadata file of the NCNN model ``param`` (``NAME.ncnn.param`` → ``NAME.ncnn.json``)."""
    return param.with_suffix(".json")


def read_metadata(path: Path) -> dict[str, str]:
    """Our metadata, from the JSON file beside the param file."""
    return read_json_metadata(metadata_path(path))


def _output_names(param: Path) -> list[str]:
    """The graph's output blobs (PNNX's ``out0``, ``out1`` ...) in order, from the param file's layer lines."""
    produced: list[str] = []
    consumed: set[str] = set()
    for line in param.read_text(encoding="utf-8").splitlines()[2:]:
        fields = line.split()
        if len(fields) < 4:
            continue
        n_in, n_out = int(fields[2]), int(fields[3])
        consumed.update(fields[4:4 + n_in])
        produced += fields[4 + n_in:4 + n_in + n_out]
    return sorted((b for b in produced if b not in consumed), key=lambda b: (len(b), b))


class NcnnModel(ExportedModel):
    """An NCNN model written by :func:`~yolotrain.interop.exporting.exporter.export`, run by the ``ncnn`` package
    on the CPU (no Vulkan), one image at a time at the export's size."""

    format_name = "NCNN"

    def __init__(self, path: str | os.PathLike) -> None:
        path = Path(path)
        metadata = metadata_beside(path, ((path.with_suffix(".bin"), "weights"), (metadata_path(path), "metadata")))
        size = json.loads(metadata["img_size"]) if "img_size" in metadata else [None, None]
        super().__init__(path, metadata, [1, 3, *size])
        ncnn = _ncnn_module()
        self._ncnn = ncnn
        self.net = ncnn.Net()
        self.net.opt.use_vulkan_compute = False
        self.net.opt.num_threads = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                       else os.cpu_count() or 1)
        if self.net.load_param(str(path)) != 0 or self.net.load_model(str(path.with_suffix(".bin"))) != 0:
            raise CheckpointError(f"{path}: not a loadable NCNN model (its param or weights file is damaged)")
        self.outputs = _output_names(path)

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        # ncnn.Mat wraps the array's memory without holding the array: the contiguous copy (made for an input in
        # another layout, such as predict's channels-last batches) must outlive the Mat until its clone.
        image = np.ascontiguousarray(images[0])
        with self.net.create_extractor() as extractor:
            extractor.input(INPUT_NAME, self._ncnn.Mat(image).clone())
            results = []
            for name in self.outputs:
                status, blob = extractor.extract(name)
                if status != 0:
                    raise RuntimeError(f"NCNN could not compute {name} (status {status})")
                results.append(np.array(blob)[None])
        return results


def _unavailable() -> str | None:
    try:
        _pnnx_executable()
    except ImportError as error:
        return str(error)
    return None


FORMAT = ExportFormat(name="ncnn", suffix=SUFFIX, title="NCNN", write=write, read_metadata=read_metadata,
                      half=True, outputs=frozenset({BOXES, MASK_PROTOTYPES, LOGITS}), companions=(".bin", ".json"),
                      exact_suffix=True, runtime=NcnnModel, unavailable=_unavailable, extra=EXTRA)
