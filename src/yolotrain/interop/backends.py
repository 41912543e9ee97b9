"""Which runtime backend runs an exported file: the formats' registry maps each suffix to the backend
class in that format's module (:mod:`.formats`). A backend imports its optional runtime (onnxruntime,
OpenVINO, LiteRT, TensorRT) only when it opens a file, so a missing one only matters to the files that
need it."""

from __future__ import annotations

import os

from ..checkpoint import CheckpointError
from .formats import REGISTRY, suffix_of
from .runtime import ExportedModel
from .trust import needs_trust, require_trust

# Suffix of the file a runtime loads → its backend class, from the formats' registry entries.
BACKENDS: dict[str, type[ExportedModel]] = {spec.suffix: spec.runtime for spec in REGISTRY.values() if spec.runtime}
# Exports that this platform cannot run, with the reason given to the user.
NOT_RUNNABLE: dict[str, str] = {spec.suffix: spec.not_runnable for spec in REGISTRY.values() if spec.not_runnable}


def is_exported(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an export (by suffix) rather than a checkpoint."""
    return suffix_of(path) in BACKENDS.keys() | NOT_RUNNABLE.keys()


def load_exported(path: str | os.PathLike, trust_code: bool = False) -> ExportedModel:
    """The runtime-backed detector for an exported file (``.onnx``, ``.xml``, ``.tflite``, ``.engine``,
    ``.torchscript``). TorchScript files and TensorRT engines run their own code when loaded, so they
    are refused unless ``trust_code`` (see :mod:`.trust`)."""
    suffix = suffix_of(path)
    if suffix in NOT_RUNNABLE:
        raise CheckpointError(f"{path}: {NOT_RUNNABLE[suffix]}")
    if suffix not in BACKENDS:
        raise CheckpointError(f"{path}: not an exported model (expected one of {', '.join(BACKENDS)})")
    require_trust(path, trust_code)  # before the backend's runtime is even imported
    backend = BACKENDS[suffix]
    return backend(path, trust_code=trust_code) if needs_trust(path) else backend(path)
