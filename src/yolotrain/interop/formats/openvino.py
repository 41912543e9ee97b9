"""OpenVINO IR (``.xml`` with its ``.bin`` weights), converted from the traced ONNX graph: fp16 weights,
int8 through NNCF (the decode tail in float32), NMS inside, dynamic batch and image size.
:class:`OpenVinoModel` runs it on the CPU.

Our metadata is in the IR's runtime info. Other tools read theirs from YAML files beside the IR: the
reference's ``DetectMultiBackend`` from ``<name>.yaml`` (``stride``, ``names``), written beside every
export, and ultralytics' ``AutoBackend`` from the folder's ``metadata.yaml``, written when the folder is
one model's by both tools' convention (named ``*_openvino_model``, no other IR in it). Both tools take
such a folder as the model to load."""

from __future__ import annotations

import contextlib
import os
import sys
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

import numpy as np
import yaml

from ...atomic import write_atomic
from ...checkpoint import CheckpointError
from ..exporting.calibration import openvino_decode_tail
from ..runtime import ExportedModel
from . import ExportFormat
from ._common import ONNX_OUTPUT_KINDS, ExportJob, onnx_module, onnx_proto, staged

if TYPE_CHECKING:
    import openvino

EXTRA = "pip install 'yolotrain[openvino]'"
# Where the export keeps its metadata inside the IR's runtime info.
RT_INFO_SECTION = "yolotrain"
# A folder of one OpenVINO model as the reference and ultralytics name it, and ultralytics' metadata file in it.
MODEL_FOLDER_SUFFIX = "_openvino_model"
FOLDER_METADATA = "metadata.yaml"


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
    tools_metadata = yaml.safe_dump(job.interop_metadata, sort_keys=False, allow_unicode=True)
    with staged(job.out, (".xml", ".bin", ".yaml")) as path:
        source = path.with_name("source.onnx")
        onnx.save(proto, str(source))
        model = ov.convert_model(str(source))
        source.unlink()
        if job.calibration is not None:
            model = _openvino_int8(model, job.calibration)
        for key, value in job.metadata.items():
            model.set_rt_info(value, [RT_INFO_SECTION, key])
        ov.save_model(model, str(path), compress_to_fp16=job.half)
        path.with_suffix(".yaml").write_text(tools_metadata, encoding="utf-8")
    if _is_model_folder(job.out):
        write_atomic(job.out.parent / FOLDER_METADATA, lambda file: file.write_text(tools_metadata, encoding="utf-8"))


def _is_model_folder(out: Path) -> bool:
    """Whether ``out``'s folder is the folder of this one model, as the reference and ultralytics lay one out."""
    return out.parent.name.endswith(MODEL_FOLDER_SUFFIX) and all(
        xml.name == out.name for xml in out.parent.glob("*.xml"))


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


def _dims(port: openvino.Output) -> list[int | None]:
    """A port's dimensions, None for a free one."""
    return [d.get_length() if d.is_static else None for d in port.get_partial_shape()]


class OpenVinoModel(ExportedModel):
    """An OpenVINO IR written by :func:`~yolotrain.interop.exporting.exporter.export`, compiled for the CPU.

    The CPU plugin would pick bfloat16 arithmetic on CPUs that have it; fp32 and int8 exports are
    compiled with float32 as the inference precision so they compute what PyTorch computes, fp16
    exports with float16 where the CPU supports it.

    IRs with free axes (batch, or image size with ``--dynamic-size``) run through one compiled
    model that takes any shape. A model compiled for one exact shape runs faster (about 10% for
    yolov5n on a 2-core CPU), so an input shape seen a second time (a video's frames, a predict
    loop) gets a compiled model of its own; the latest :attr:`SPECIALISED_SHAPES` are kept.
    """

    format_name = "OpenVINO"
    SPECIALISED_SHAPES = 4

    def __init__(self, path: str | os.PathLike) -> None:
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        if not path.with_suffix(".bin").is_file():
            raise CheckpointError(f"{path}: its weights file {path.with_suffix('.bin').name} is missing")
        ov = openvino_module()
        self._core = ov.Core()
        try:
            self._model = self._core.read_model(str(path))
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises plain RuntimeErrors with multi-line text
            raise CheckpointError(f"{path}: not a loadable OpenVINO model ({str(exc).splitlines()[0]})") from None
        model = self._model
        section = model.get_rt_info([RT_INFO_SECTION]).astype(dict) if model.has_rt_info([RT_INFO_SECTION]) else {}
        metadata = {key: str(value.astype(str)) for key, value in section.items()}
        super().__init__(path, metadata, _dims(model.inputs[0]), [_dims(output) for output in model.outputs])
        precision = "f16" if self.precision == "fp16" and "FP16" in self._core.get_property(
            "CPU", "OPTIMIZATION_CAPABILITIES") else "f32"
        self._config = {"INFERENCE_PRECISION_HINT": precision}
        try:
            self.request = self._core.compile_model(model, "CPU", self._config).create_infer_request()
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises plain RuntimeErrors with multi-line text
            raise CheckpointError(f"{path}: OpenVINO could not compile it ({str(exc).strip().splitlines()[0]})") \
                from None
        self._last_shape: tuple[int, ...] | None = None
        self._specialised: OrderedDict[tuple[int, ...], openvino.InferRequest] = OrderedDict()

    def _request_for(self, shape: tuple[int, ...]) -> openvino.InferRequest:
        """The infer request to run a batch of ``shape`` with: its own once the shape repeats."""
        if None not in self.input_shape:
            return self.request
        if shape in self._specialised:
            self._specialised.move_to_end(shape)
            return self._specialised[shape]
        repeated, self._last_shape = shape == self._last_shape, shape
        if not repeated:
            return self.request
        model = self._model.clone()
        model.reshape(list(shape))
        request = self._core.compile_model(model, "CPU", self._config).create_infer_request()
        self._specialised[shape] = request
        if len(self._specialised) > self.SPECIALISED_SHAPES:
            self._specialised.popitem(last=False)
        return request

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        request = self._request_for(images.shape)
        request.infer({0: images})
        return [request.get_output_tensor(i).data.copy() for i in range(len(request.model_outputs))]


FORMAT = ExportFormat(name="openvino", suffix=".xml", title="OpenVINO", write=write,
                      read_metadata=read_metadata, half=True, int8=True,
                      nms=True, dynamic=True, outputs=ONNX_OUTPUT_KINDS, companions=(".bin", ".yaml"),
                      exact_suffix=True,
                      runtime=OpenVinoModel, extra=EXTRA)
