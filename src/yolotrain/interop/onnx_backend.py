"""Run an exported ONNX detector with onnxruntime behind the same call shape as :class:`Yolov5`."""

from __future__ import annotations

import os

import numpy as np

from ..checkpoint import CheckpointError
from .formats._common import EXPORT_PACKAGES_HINT
from .runtime import ExportedModel


class OnnxModel(ExportedModel):
    """An ONNX file written by :func:`~yolotrain.interop.export.export`, run with onnxruntime.

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
