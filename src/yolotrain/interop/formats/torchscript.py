"""TorchScript (``.torchscript``), traced from the PyTorch module, metadata in its ``config.json``: float32,
raw head maps possible, fixed at batch 1 and the export's size. A TorchScript file is a program, so
loading one needs the user's trust (:mod:`..trust`)."""

from __future__ import annotations

import json
import warnings
import zipfile
from pathlib import Path

import torch

from ..export_graph import BOXES, LOGITS, MASK_PROTOTYPES
from . import ExportFormat
from ._common import MAX_METADATA_BYTES, ExportJob, staged


def write(job: ExportJob) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        # TorchScript is deprecated upstream but still what C++/mobile deployments load; the user asked for it.
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        traced = torch.jit.trace(job.graph, job.example, strict=False, check_trace=False)
        with staged(job.out) as path:
            torch.jit.save(traced, str(path), _extra_files={"config.json": json.dumps(job.metadata)})


def read_metadata(path: Path) -> dict[str, str]:
    """The ``config.json`` extra file of a TorchScript archive, read with :mod:`zipfile` (nothing of it runs)."""
    with zipfile.ZipFile(path) as archive:
        member = next((m for m in archive.infolist() if m.filename.endswith("/extra/config.json")), None)
        if member is None or member.file_size > MAX_METADATA_BYTES:
            return {}
        return json.loads(archive.read(member))


FORMAT = ExportFormat(name="torchscript", suffix=".torchscript", title="TorchScript", write=write,
                      read_metadata=read_metadata, raw=True, outputs=frozenset({BOXES, MASK_PROTOTYPES, LOGITS}),
                      runtime=("torchscript_backend", "TorchScriptModel"),
                      runs_code="a TorchScript file is a program that runs its own code when loaded and called "
                                "(it can create and write files)")
