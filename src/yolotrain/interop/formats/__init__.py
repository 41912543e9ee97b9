"""The export formats, one module each, found here: the single list of formats the exporter, the
runtime loader (:mod:`..backends`) and the trust check (:mod:`..trust`) all read.

Each module in this package (names starting with ``_`` excepted) holds one format's writer and, for a
format that runs here, its runtime backend (an :class:`~..runtime.ExportedModel`), and defines ``FORMAT``,
an :class:`ExportFormat` saying what the format can do, how it is written and which backend loads it.
A backend imports its runtime (onnxruntime, OpenVINO, LiteRT, TensorRT) only when it opens a file, so
writing one format never needs another's runtime. Adding a format is adding one module (see
docs/ARCHITECTURE.md, "How to add a format").
"""

from __future__ import annotations

import pkgutil
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from ..exporting.graph import BOXES
from ._common import ConversionError, ExportJob

if TYPE_CHECKING:
    from ..runtime import ExportedModel

# What reading a damaged or foreign file's metadata raises (an XML parse error is a SyntaxError; zipfile
# raises NotImplementedError for compression methods it lacks).
_UNREADABLE = (OSError, EOFError, ValueError, KeyError, TypeError, RuntimeError, NotImplementedError, SyntaxError,
               struct.error, zipfile.BadZipFile, zlib.error)


@dataclass(frozen=True)
class ExportFormat:
    """One export format: its name (``--format``), file suffix, capabilities, writer and runtime.

    ``half``/``int8``/``nms``/``raw``: whether it can store fp16 or int8, build NMS inside, output the
    raw head maps; ``mobile``: whether it can be written for PyTorch Mobile's lite interpreter (``--optimize``);
    ``keras``: whether it can be written by Keras (``--keras``).
    ``outputs``: the output kinds it carries (:data:`~..exporting.graph.BOXES`,
    :data:`~..exporting.graph.MASK_PROTOTYPES`, :data:`~..exporting.graph.LOGITS` ...); a model exports to it when
    it carries every kind the model's task gives (:meth:`carries`). ``dynamic``: whether its graph keeps a
    free batch axis and
    image size (the others are fixed at batch 1 and the export's size). ``companions``: suffixes of the
    files written beside the main one (OpenVINO's ``.bin``). ``exact_suffix``: whether ``--output``
    must end in ``suffix``.
    ``read_metadata``: the metadata our exports store, read from a file of this format as data (nothing of
    it is loaded or run; see :func:`export_metadata_of`).
    ``runtime``: the backend class that runs the file (defined in the format's module), or
    ``not_runnable``: why it cannot run here. ``runs_code``: why loading such a file runs code it
    carries (it then needs ``trust_code``). ``unavailable``: a check returning why the format cannot
    be written on this machine, or None. ``extra``: the install command for its optional packages.
    """

    name: str
    suffix: str
    title: str
    write: Callable[[ExportJob], None]
    read_metadata: Callable[[Path], Mapping[str, str]]
    half: bool = False
    int8: bool = False
    nms: bool = False
    raw: bool = False
    mobile: bool = False
    keras: bool = False
    outputs: frozenset[str] = frozenset({BOXES})
    dynamic: bool = False
    companions: tuple[str, ...] = ()
    exact_suffix: bool = False
    runtime: type[ExportedModel] | None = None
    not_runnable: str | None = None
    runs_code: str | None = None
    unavailable: Callable[[], str | None] | None = None
    extra: str | None = None

    def carries(self, output_kinds: Iterable[str]) -> bool:
        """Whether this format carries every one of ``output_kinds``."""
        return self.outputs.issuperset(output_kinds)


def export_metadata_of(path: str | Path, spec: ExportFormat) -> dict[str, str] | None:
    """The yolotrain metadata of an existing file of ``spec``'s format, read as data (nothing of it is
    loaded or run); None when it carries none (another program's file, or not of this format at all)
    or cannot be read."""
    try:
        metadata = spec.read_metadata(Path(path))
    except _UNREADABLE:
        return None
    if not isinstance(metadata, Mapping) or metadata.get("producer") != "yolotrain":
        return None
    return {str(key): str(value) for key, value in metadata.items()}


def _discover() -> dict[str, ExportFormat]:
    found: dict[str, ExportFormat] = {}
    for module in sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")):
        spec: ExportFormat = import_module(f"{__name__}.{module}").FORMAT
        if spec.name in found or any(spec.suffix == other.suffix for other in found.values()):
            raise TypeError(f"export format {spec.name!r} ({spec.suffix}) is declared twice")
        found[spec.name] = spec
    return found


# Name → format, alphabetical.
REGISTRY: dict[str, ExportFormat] = _discover()
BY_SUFFIX: dict[str, ExportFormat] = {spec.suffix: spec for spec in REGISTRY.values()}




def suffix_of(path: str | Path) -> str:
    """The export suffix ``path``'s name ends with, lower-cased: the longest registered one it ends with (NCNN's
    ``.ncnn.param``), else its last suffix."""
    name = Path(path).name.lower()
    return max((suffix for suffix in BY_SUFFIX if name.endswith(suffix)), key=len, default=Path(path).suffix.lower())


__all__ = ["BY_SUFFIX", "REGISTRY", "ConversionError", "ExportFormat", "ExportJob", "export_metadata_of", "suffix_of"]
