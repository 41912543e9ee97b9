"""TorchScript (``.torchscript``), traced from the PyTorch module, metadata in its ``config.json`` (and the
fields other tools read in ``config.txt``, where the reference's ``DetectMultiBackend`` and ultralytics'
``AutoBackend`` look for them, as JSON): float32, raw head maps possible, fixed at batch 1 and the export's
size. A TorchScript file is a program, so
loading one needs the user's trust (:mod:`..trust`). :class:`TorchScriptModel` runs it with the TorchScript
interpreter."""

from __future__ import annotations

import json
import os
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.mobile_optimizer import optimize_for_mobile

from ...checkpoint import CheckpointError
from ..exporting.graph import BOXES, LOGITS, MASK_PROTOTYPES
from ..runtime import ExportedModel
from ..trust import require_trust
from . import ExportFormat
from ._common import MAX_METADATA_BYTES, ExportJob, staged


def write(job: ExportJob) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        # TorchScript is deprecated upstream but still what C++/mobile deployments load; the user asked for it.
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        # The lite interpreter is deprecated upstream too (ExecuTorch succeeds it); --optimize asked for it.
        warnings.filterwarnings("ignore", message="Lite Interpreter is deprecated")
        traced = torch.jit.trace(job.graph, job.example, strict=False, check_trace=False)
        module, mobile = for_mobile(traced) if job.optimize else (traced, None)
        metadata = job.metadata if mobile is None else {**job.metadata, "mobile": mobile}
        extra = {"config.json": json.dumps(metadata), "config.txt": json.dumps(job.interop_metadata)}
        with staged(job.out) as path:
            if mobile is None:
                torch.jit.save(module, str(path), _extra_files=extra)
            else:  # the bytecode the lite interpreter runs, beside the TorchScript code torch.jit.load reads
                module._save_for_lite_interpreter(str(path), _extra_files=extra)


def for_mobile(traced: torch.jit.ScriptModule) -> tuple[torch.jit.ScriptModule, str]:
    """``traced`` prepared for PyTorch Mobile, and how: ``optimize_for_mobile`` (frozen, convolutions rewritten to
    XNNPACK's prepacked ops) where this PyTorch build has XNNPACK, else frozen only (its weights folded into the
    graph as constants; x86 wheels are built without XNNPACK, and the mobile pass then fails on an assertion)."""
    try:
        return optimize_for_mobile(traced), "xnnpack"
    except RuntimeError as exc:
        if "XNNPACK is not enabled" not in str(exc):
            raise
        return torch.jit.freeze(traced.eval()), "frozen"


def read_metadata(path: Path) -> dict[str, str]:
    """The ``config.json`` extra file of a TorchScript archive, read with :mod:`zipfile` (nothing of it runs)."""
    with zipfile.ZipFile(path) as archive:
        member = next((m for m in archive.infolist() if m.filename.endswith("/extra/config.json")), None)
        if member is None or member.file_size > MAX_METADATA_BYTES:
            return {}
        return json.loads(archive.read(member))


class TorchScriptModel(ExportedModel):
    """A ``.torchscript`` file written by :func:`~yolotrain.interop.exporting.exporter.export`, run by the TorchScript
    interpreter on the CPU. The graph was traced at batch 1 and one image size, so batches run one
    image at a time. Loading a TorchScript archive runs no pickled Python code, but the archive's own
    TorchScript code runs: it is refused unless ``trust_code`` (see :mod:`..trust`)."""

    format_name = "TorchScript"

    def __init__(self, path: str | os.PathLike, trust_code: bool = False) -> None:
        path = Path(path)
        require_trust(path, trust_code)
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        extra = {"config.json": ""}
        try:
            with warnings.catch_warnings():  # TorchScript is deprecated upstream; this file was asked for
                warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
                self.module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra).eval()
        except RuntimeError as exc:
            raise CheckpointError(f"{path}: not a loadable TorchScript model ({str(exc).splitlines()[0]})") from None
        try:
            metadata = json.loads(extra["config.json"] or "{}")
        except json.JSONDecodeError:
            metadata = {}
        size = json.loads(metadata["img_size"]) if "img_size" in metadata else [None, None]
        super().__init__(path, metadata, [1, 3, *size])

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        # Channels-last input, as our PyTorch inference uses: oneDNN's NHWC convolutions are faster on
        # the CPU (yolov5n at 640: ~32 ms against ~41 ms), and the layout carries through the graph.
        batch = torch.from_numpy(images).contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            outputs = self.module(batch)
        return [o.numpy() for o in (outputs if isinstance(outputs, (tuple, list)) else (outputs,))]


FORMAT = ExportFormat(name="torchscript", suffix=".torchscript", title="TorchScript", write=write,
                      read_metadata=read_metadata, raw=True, mobile=True,
                      outputs=frozenset({BOXES, MASK_PROTOTYPES, LOGITS}),
                      runtime=TorchScriptModel,
                      runs_code="a TorchScript file is a program that runs its own code when loaded and called "
                                "(it can create and write files)")
