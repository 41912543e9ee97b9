"""ONNX (``.onnx``), run with onnxruntime: fp16 (float32 inputs, outputs and decode tail), int8 (static QDQ
calibrated by min/max; which nodes stay float, and why, is in docs/int8.md), NMS inside, raw head maps,
dynamic batch and image size. :class:`OnnxModel` runs it."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ...checkpoint import CheckpointError
from ..exporting.calibration import OnnxCalibrationReader, onnx_decode_tail, onnx_int8_float_nodes
from ..runtime import ExportedModel
from . import ExportFormat
from ._common import (
    EXPORT_PACKAGES_HINT,
    ONNX_OUTPUT_KINDS,
    ExportJob,
    onnx_module,
    onnx_proto,
    protobuf_field,
    protobuf_string_map,
    staged,
)

# The field of ONNX's ModelProto holding metadata_props.
METADATA_PROPS_FIELD = 14


def write(job: ExportJob) -> None:
    onnx = onnx_module()
    proto = onnx_proto(job)
    if job.half:
        proto = _onnx_fp16(proto)
    with staged(job.out) as path:
        if job.calibration is not None:
            _onnx_int8(proto, path, job.calibration)
            proto = onnx.load(str(path))
        for key, value in job.metadata.items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.checker.check_model(proto)
        onnx.save(proto, str(path))


def read_metadata(path: Path) -> dict[str, str]:
    """The ``metadata_props`` of an ONNX file, read from its protobuf without the onnx package (the graph and
    its weights are skipped, not read)."""
    with path.open("rb") as file:
        return protobuf_string_map(protobuf_field(file, METADATA_PROPS_FIELD, os.fstat(file.fileno()).st_size))


def _onnx_fp16(proto: Any) -> Any:
    """fp16 weights and arithmetic; float32 inputs and outputs, and the decode tail kept in float32."""
    from onnxruntime.transformers.float16 import convert_float_to_float16


    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # values clipped to the fp16 range are reported per tensor
        converted = convert_float_to_float16(proto, keep_io_types=True, node_block_list=onnx_decode_tail(proto))
    _sort_nodes(converted.graph)
    return converted


def _sort_nodes(graph: Any) -> None:
    """Put the nodes in topological order (the fp16 converter appends its input casts at the end)."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        runnable = [all(i in ready for i in n.input) for n in pending]
        if not any(runnable):
            raise ValueError("the converted ONNX graph has a cycle or an undefined input")
        ordered += [n for n, ok in zip(pending, runnable) if ok]
        ready.update(o for n, ok in zip(pending, runnable) if ok for o in n.output)
        pending = [n for n, ok in zip(pending, runnable) if not ok]
    del graph.node[:]
    graph.node.extend(ordered)


def _onnx_int8(proto: Any, out: Path, calibration: Any) -> None:
    """Static QDQ quantization (int8 weights per channel, uint8 activations) calibrated by min/max;
    the decode tail, the head's convolutions and the layers feeding them, and the stem stay float32
    (measured in docs/int8.md)."""
    try:
        from onnxruntime.quantization import QuantFormat, QuantType, quant_pre_process, quantize_static
    except ImportError:
        raise ImportError(f"int8 ONNX export needs 'onnxruntime' ({EXPORT_PACKAGES_HINT})") from None
    onnx = onnx_module()


    prepared = out.with_name(out.name + ".prepared.onnx")
    onnx.save(proto, str(prepared))
    quant_pre_process(str(prepared), str(prepared), skip_symbolic_shape=True)
    float_nodes = onnx_int8_float_nodes(onnx.load(str(prepared)))
    reader = OnnxCalibrationReader(calibration, proto.graph.input[0].name)
    quantize_static(str(prepared), str(out), reader, quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_exclude=float_nodes)
    prepared.unlink()


class OnnxModel(ExportedModel):
    """An ONNX file written by :func:`~yolotrain.interop.exporting.exporter.export`, run with onnxruntime.

    fp32, fp16 (float32 inputs and outputs, fp16 inside) and int8 (QDQ) exports all run here.
    """

    format_name = "ONNX"

    def __init__(self, path: str | os.PathLike, providers: list[str] | None = None) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise ImportError(f"running ONNX models needs 'onnxruntime' ({EXPORT_PACKAGES_HINT})") from None
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: no such file")
        options = onnxruntime.SessionOptions()
        # Between runs the caller letterboxes, decodes and runs NMS with PyTorch, whose threads need
        # the same cores: onnxruntime's workers must sleep rather than spin after a run (spinning
        # made single-image predict ~1.7x slower on a 2-core CPU).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # Runtime failures are raised as one line naming the file; onnxruntime's own log would repeat them.
        options.log_severity_level = 4
        try:
            self.session = onnxruntime.InferenceSession(str(path), options,
                                                        providers=providers or ["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own unexported exception types
            raise CheckpointError(f"{path}: not a loadable ONNX model ({str(exc).splitlines()[0]})") from None
        self.input = self.session.get_inputs()[0]
        super().__init__(path, self.session.get_modelmeta().custom_metadata_map, self.input.shape,
                         [output.shape for output in self.session.get_outputs()])

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        return self.session.run(None, {self.input.name: images})


FORMAT = ExportFormat(name="onnx", suffix=".onnx", title="ONNX", write=write, read_metadata=read_metadata,
                      half=True, int8=True, nms=True, raw=True, dynamic=True, outputs=ONNX_OUTPUT_KINDS,
                      runtime=OnnxModel, extra=EXPORT_PACKAGES_HINT)
