"""What every format writer receives (:class:`ExportJob`) and the pieces several of them share: staged
writes that leave nothing behind on failure, the traced ONNX graph the ONNX-based formats start from,
and reading the metadata of protobuf files (ONNX, Core ML) as data, without their packages."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from ...checkpoint import CheckpointError
from ..exporting.graph import (
    BOXES,
    DECODED_OUTPUT,
    DETECTIONS_OUTPUT,
    LOGITS,
    MASK_PROTOTYPES,
    PROTO_OUTPUT,
    ExportGraph,
    raw_output_names,
)

if TYPE_CHECKING:
    from ..exporting.calibration import CalibrationImages

EXPORT_PACKAGES_HINT = "pip install 'yolotrain[export]'"
# Longest a conversion of the largest published model takes on a 2-core CPU, with room to spare.
CONVERT_TIMEOUT_S = 900
# Largest metadata read from an existing file; ours is a few KB.
MAX_METADATA_BYTES = 1 << 20


class ConversionError(RuntimeError):
    """A converter failed. One run as a process of its own (onnx2tf, PNNX, MNN's, X2Paddle,
    ``tensorflowjs_converter``) failed, wrote nothing or ran out of time: the message is one line naming it, with the
    last line it printed. One inside this process (PyTorch's ONNX exporter, Core ML, OpenVINO ...) raised: one line
    naming the format and the error, which is the cause (``__cause__``)."""


def run_converter(command: Sequence[str], failure: str, made: Callable[[str], bool], cwd: Path,
                  env: dict[str, str] | None = None, timeout_s: float = CONVERT_TIMEOUT_S) -> None:
    """Run a converter's ``command`` in ``cwd``; ``made(printed)`` (its stdout and stderr together) says whether it
    wrote what was asked.

    Raises:
        ConversionError: ``failure`` with the converter's last printed line, when it exits with an error, ``made``
            is false, or it runs past ``timeout_s`` (then stopped).
    """
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        raise ConversionError(f"{failure} (stopped after {timeout_s:g} s)") from None
    if done.returncode != 0 or not made(done.stdout + done.stderr):
        lines = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()
        raise ConversionError(f"{failure} ({lines[-1].strip()})")


@dataclass(frozen=True)
class ExportJob:
    """One export, checked and ready: the graph to trace, an example input, where to write, the
    metadata to store (``metadata``: the string map, ours and the fields other tools read;
    ``interop_metadata``: those fields as values, for the formats that store values), the precision
    (``half``, or ``calibration`` images for int8) and the ONNX
    tracing options (``dynamic_*`` already off for formats without free axes); ``optimize``: written for
    PyTorch Mobile's lite interpreter (TorchScript); ``keras``: a SavedModel written by Keras."""

    graph: ExportGraph
    example: torch.Tensor
    out: Path
    metadata: dict[str, str]
    interop_metadata: dict[str, Any]
    half: bool
    calibration: CalibrationImages | None
    size: tuple[int, int]
    min_side: int
    dynamic_batch: bool
    dynamic_size: bool
    simplify: bool
    opset: int
    optimize: bool = False
    keras: bool = False


@contextlib.contextmanager
def staged(out: Path, suffixes: Sequence[str] = ("",)) -> Iterator[Path]:
    """A temporary path beside ``out`` to write to; on success it (and its siblings with ``suffixes``
    replacing the suffix, e.g. OpenVINO's ``.bin``) is renamed onto ``out``, on failure removed."""
    folder = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    staged_path = folder / out.name
    try:
        yield staged_path
        # The companions first: a reader finds the main file only once everything it points to is there.
        for suffix in sorted(suffixes, key=lambda s: s in ("", out.suffix)):
            source, target = ((staged_path.with_suffix(suffix), out.with_suffix(suffix)) if suffix
                              else (staged_path, out))
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(source, target)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def quiet_output(descriptors: Sequence[int] = (1, 2)) -> Iterator[None]:
    """File ``descriptors`` (stdout, stderr) pointed at the null device meanwhile: the notes a runtime's compiled
    code prints (the CPU's features, the precision) stay off the program's output."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in descriptors]
    try:
        with open(os.devnull, "w") as null:
            for fd in descriptors:
                os.dup2(null.fileno(), fd)
            yield
    finally:
        for fd, copy in zip(descriptors, saved):
            os.dup2(copy, fd)
            os.close(copy)


def metadata_beside(path: Path, companions: Sequence[tuple[Path, str]]) -> dict[str, str]:
    """The metadata of a model file ``path`` kept in a JSON file beside it (the last of ``companions``, pairs of a
    file and what it holds, each required): one line naming the missing file, ``{}`` for unreadable metadata (the
    runtime's base then says the file lacks ours)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    for companion, what in companions:
        if not companion.is_file():
            raise CheckpointError(f"{path}: its {what} file {companion.name} is missing")
    try:
        metadata = read_json_metadata(companions[-1][0])
    except (OSError, ValueError):
        return {}
    return metadata if isinstance(metadata, dict) else {}


def read_json_metadata(source: Path) -> dict[str, str]:
    """A metadata JSON file, as data; ``{}`` when it is larger than any metadata of ours."""
    if source.stat().st_size > MAX_METADATA_BYTES:
        return {}
    return json.loads(source.read_text(encoding="utf-8"))


def json_metadata_or_empty(source: Path) -> dict:
    """:func:`read_json_metadata`, or ``{}`` when the file is missing, unreadable or not a JSON object: a model
    loads without ours (a foreign file), and what the runtime needs is checked against the graph itself."""
    try:
        metadata = read_json_metadata(source)
    except (OSError, ValueError):
        return {}
    return metadata if isinstance(metadata, dict) else {}


def _boxes_outputs(graph: ExportGraph, batch: dict[int, str], dynamic_size: bool) -> dict[str, dict[int, str]]:
    """The raw head maps (one per level), the final detections, or the decoded predictions."""
    if graph.raw:
        return {name: batch | ({2: f"grid_height{level}", 3: f"grid_width{level}"} if dynamic_size else {})
                for level, name in enumerate(raw_output_names(graph.model))}
    if graph.nms is not None:
        return {DETECTIONS_OUTPUT: batch}
    return {DECODED_OUTPUT: batch | ({1: "predictions"} if dynamic_size else {})}


def _mask_prototype_outputs(graph: ExportGraph, batch: dict[int, str], dynamic_size: bool) -> dict[str, dict[int, str]]:
    return {PROTO_OUTPUT: batch | ({2: "proto_height", 3: "proto_width"} if dynamic_size else {})}


def _logits_outputs(graph: ExportGraph, batch: dict[int, str], dynamic_size: bool) -> dict[str, dict[int, str]]:
    return {DECODED_OUTPUT: batch}  # (logits [B, nc] have no axis that follows the image size)


# Output kind → its ONNX outputs' names and free axes, given the graph, the batch axis and whether the
# image size is free.
_ONNX_OUTPUTS: dict[str, Callable[[ExportGraph, dict[int, str], bool], dict[str, dict[int, str]]]] = {
    BOXES: _boxes_outputs, MASK_PROTOTYPES: _mask_prototype_outputs, LOGITS: _logits_outputs}
# The output kinds an ONNX graph (and the formats converted from it) carries: those it can name.
ONNX_OUTPUT_KINDS = frozenset(_ONNX_OUTPUTS)


def onnx_outputs(graph: ExportGraph, dynamic_batch: bool, dynamic_size: bool) -> dict[str, dict[int, str]]:
    """The traced graph's ONNX outputs in order, each name with its free axes, for the output kinds of its
    model's task."""
    batch = {0: "batch"} if dynamic_batch else {}
    outputs: dict[str, dict[int, str]] = {}
    for kind in graph.task.export_outputs:
        outputs.update(_ONNX_OUTPUTS[kind](graph, batch, dynamic_size))
    return outputs


def onnx_module():
    try:
        import onnx
    except ImportError:
        raise ImportError(f"ONNX export needs the 'onnx' package ({EXPORT_PACKAGES_HINT})") from None
    return onnx


def onnx_proto(job: ExportJob) -> Any:
    """The traced float32 graph as an ONNX ``ModelProto`` (OpenVINO and TensorRT convert from it too)."""
    onnx = onnx_module()
    graph = job.graph
    outputs = onnx_outputs(graph, job.dynamic_batch, job.dynamic_size)
    batch = {0: "batch"} if job.dynamic_batch else {}
    axes = {"images": batch | ({2: "height", 3: "width"} if job.dynamic_size else {}), **outputs}
    with tempfile.TemporaryDirectory(prefix="yolotrain-export-") as folder:
        traced = Path(folder) / "traced.onnx"
        with warnings.catch_warnings():
            # The TorchScript-based exporter: the dynamo one needs onnxscript, which is not a
            # dependency, so its deprecation notices are expected here.
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(graph, (job.example,), str(traced), dynamo=False, opset_version=job.opset,
                              input_names=["images"], output_names=list(outputs), do_constant_folding=True,
                              dynamic_axes={name: value for name, value in axes.items() if value})
        proto = onnx.load(str(traced))
    return _simplify(proto) if job.simplify else proto


def _simplify(proto: Any) -> Any:
    try:
        import onnxslim
    except ImportError:
        raise ImportError(f"simplifying the ONNX graph needs 'onnxslim' ({EXPORT_PACKAGES_HINT}), "
                          "or pass simplify=False / --no-simplify") from None
    return onnxslim.slim(proto)


def _varint(stream: IO[bytes]) -> int:
    value = shift = 0
    while True:
        byte = stream.read(1)
        if not byte:
            raise EOFError("protobuf message ends inside a number")
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
        if shift > 63:
            raise ValueError("protobuf number longer than 64 bits")


def protobuf_field(stream: IO[bytes], number: int, end: int, limit: int = MAX_METADATA_BYTES) -> list[bytes]:
    """The payloads of the length-delimited fields ``number`` of the protobuf message read from ``stream``
    up to offset ``end``; the other fields (a model's weights) are skipped by seeking, never read.

    Raises:
        ValueError: not a protobuf message, or a wanted payload larger than ``limit`` bytes.
        EOFError: the message ends early.
    """
    found = []
    while stream.tell() < end:
        key = _varint(stream)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _varint(stream)
        elif wire in (1, 5):
            stream.seek(8 if wire == 1 else 4, io.SEEK_CUR)
        elif wire == 2:
            length = _varint(stream)
            if field != number:
                stream.seek(length, io.SEEK_CUR)
                continue
            if length > limit:
                raise ValueError(f"protobuf field {number} of {length} bytes, more than {limit}")
            found.append(stream.read(length))
            if len(found[-1]) < length:
                raise EOFError("protobuf message ends inside a field")
        else:
            raise ValueError(f"protobuf wire type {wire} is not one of a message's")
    if stream.tell() > end:
        raise EOFError("protobuf field runs past its message")
    return found


def message_field(message: bytes, number: int) -> list[bytes]:
    """:func:`protobuf_field` of a message held in memory."""
    return protobuf_field(io.BytesIO(message), number, len(message))


def protobuf_string_map(entries: list[bytes]) -> dict[str, str]:
    """A protobuf ``map<string, string>`` (or ONNX's repeated ``StringStringEntryProto``) from its entries
    (each a message: key field 1, value field 2)."""
    return {b"".join(message_field(entry, 1)).decode(): b"".join(message_field(entry, 2)).decode()
            for entry in entries}
