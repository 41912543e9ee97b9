"""OpenVINO IR (``.xml`` with its ``.bin`` weights), converted from the traced ONNX graph: fp16 weights,
int8 through NNCF (the decode tail in float32), NMS inside, dynamic batch and image size."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from ..calibration import openvino_decode_tail
from . import ExportFormat
from ._common import ONNX_OUTPUT_KINDS, ExportJob, onnx_module, onnx_proto, staged

EXTRA = "pip install 'yolotrain[openvino]'"
# Where the export keeps its metadata inside the IR's runtime info.
RT_INFO_SECTION = "yolotrain"


def openvino_module():
    try:
        import openvino
    except ImportError:
        raise ImportError(f"OpenVINO models need the 'openvino' package ({EXTRA})") from None
    return openvino


def write(job: ExportJob) -> None:
    ov = openvino_module()
    onnx = onnx_module()
    proto = onnx_proto(job)
    with staged(job.out, (".xml", ".bin")) as path:
        source = path.with_name("source.onnx")
        onnx.save(proto, str(source))
        model = ov.convert_model(str(source))
        source.unlink()
        if job.calibration is not None:
            model = _openvino_int8(model, job.calibration)
        for key, value in job.metadata.items():
            model.set_rt_info(value, [RT_INFO_SECTION, key])
        ov.save_model(model, str(path), compress_to_fp16=job.half)


def read_metadata(path: Path) -> dict[str, str]:
    """The ``rt_info`` section the export writes its metadata to, read from the IR's XML (each entry an
    element ``<KEY value="..."/>``)."""
    section = ElementTree.parse(path).getroot().find(f"rt_info/{RT_INFO_SECTION}")
    return {} if section is None else {item.tag: item.get("value", "") for item in section}


def _openvino_int8(model: Any, calibration: Any) -> Any:
    try:
        import nncf
    except ImportError:
        raise ImportError(f"int8 OpenVINO export needs 'nncf' ({EXTRA})") from None
    nncf.set_log_level(40)  # errors only: its progress bars and notes are not ours to print
    dataset = nncf.Dataset(calibration)
    scope = nncf.IgnoredScope(names=openvino_decode_tail(model), validate=False)
    with contextlib.redirect_stdout(sys.stderr):  # its progress bars
        return nncf.quantize(model, dataset, subset_size=len(calibration), preset=nncf.QuantizationPreset.MIXED,
                             ignored_scope=scope)


FORMAT = ExportFormat(name="openvino", suffix=".xml", title="OpenVINO", write=write,
                      read_metadata=read_metadata, half=True, int8=True,
                      nms=True, dynamic=True, outputs=ONNX_OUTPUT_KINDS, companions=(".bin",), exact_suffix=True,
                      runtime=("openvino_backend", "OpenVinoModel"), extra=EXTRA)
