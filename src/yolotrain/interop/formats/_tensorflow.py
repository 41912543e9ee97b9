"""What TensorFlow's formats (:mod:`.saved_model`, :mod:`.pb`) share: the conversion of the traced ONNX graph by
onnx2tf in a child process (:mod:`._tensorflow_convert`), and the runtime base that feeds TensorFlow's
channels-last graphs.

onnx2tf turns the graph's NCHW input into NHWC (TensorFlow's layout, TF Lite's and TF.js's too) and keeps the
decoded outputs as they are, but a 4-D output (segmentation's mask prototypes) channels-last as well; the runtime
transposes both ways. It runs an ONNX Runtime session on a sample of 20 images of 128 x 128 (NHWC float32 in
[0, 1], resized to the export's size) to check each converted operation against the ONNX one, and downloads that
sample from GitHub unless its working folder holds it: the conversion runs in a scratch folder where we write a
deterministic synthetic sample, with network connections refused (so an export never downloads, and converts the
same graph to the same model every time)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ._common import ExportJob, onnx_module, onnx_proto, quiet_output, run_converter

EXTRA = "pip install 'yolotrain[tensorflow]'"
# What the conversion imports: TensorFlow, onnx2tf and the packages onnx2tf imports without requiring them.
CONVERTER_MODULES = ("tensorflow", "tf_keras", "onnx2tf", "onnx_graphsurgeon", "sng4onnx", "onnx", "onnxruntime")
# onnx2tf's image sample: the file name it looks for in its working folder, and its shape (images, H, W, C).
SAMPLE_FILE = "calibration_image_sample_data_20x128x128x3_float32.npy"
SAMPLE_SHAPE = (20, 128, 128, 3)
_CONVERTER = Path(__file__).with_name("_tensorflow_convert.py")
# What Keras accepts in a layer's name (onnx2tf names layers after the ONNX nodes, which the exporter names
# "/model.10/m/m.0/attn/Conv"): no leading slash, no characters but these.
_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9_./>-]")
# TensorFlow's compiled code writes notes (CPU features, no CUDA driver) on stderr as it loads and runs: errors only,
# unless the program says otherwise.
_LOG_LEVEL = ("TF_CPP_MIN_LOG_LEVEL", "3")


def unavailable() -> str | None:
    """Why TensorFlow exports cannot be written here (a converter package missing), or None."""
    missing = [name for name in CONVERTER_MODULES if importlib.util.find_spec(name) is None]
    return f"TensorFlow export needs {', '.join(missing)} ({EXTRA})" if missing else None


def sample_images() -> np.ndarray:
    """The image sample onnx2tf checks its conversion on: smooth random colour fields, the same every time."""
    generator = np.random.default_rng(0)
    coarse = generator.random((SAMPLE_SHAPE[0], 8, 8, SAMPLE_SHAPE[3]), dtype=np.float32)
    # Each coarse cell repeated to 16 x 16 pixels, plus fine noise: image-like values in [0, 1].
    fields = coarse.repeat(SAMPLE_SHAPE[1] // 8, axis=1).repeat(SAMPLE_SHAPE[2] // 8, axis=2)
    noise = generator.random(SAMPLE_SHAPE, dtype=np.float32)
    return np.clip(0.9 * fields + 0.1 * noise, 0.0, 1.0).astype(np.float32)


def convert(job: ExportJob, kind: str, output: Path) -> None:
    """Convert ``job``'s traced graph to TensorFlow's ``kind`` (``saved_model``, ``keras_saved_model``, ``pb``, or
    ``tfjs_saved_model``: a SavedModel whose grouped convolutions are split, as TF.js runs them) at ``output``."""
    if (missing := unavailable()) is not None:
        raise ImportError(missing)
    onnx = onnx_module()
    with tempfile.TemporaryDirectory(prefix="yolotrain-tensorflow-") as scratch:
        source = Path(scratch) / "model.onnx"
        onnx.save(keras_named(onnx_proto(job)), str(source))
        np.save(Path(scratch) / SAMPLE_FILE, sample_images())
        command = [sys.executable, str(_CONVERTER), str(source), kind, str(output)]
        run_converter(command, "onnx2tf could not convert the model to TensorFlow", lambda _: output.exists(),
                      Path(scratch))


def keras_named(proto: Any) -> Any:
    """The ONNX graph ``proto`` with its nodes renamed to names Keras takes for layers (the names alone change)."""
    for node in proto.graph.node:
        node.name = _NAME_CHARACTERS.sub("_", node.name).lstrip("/")
    return proto


def tensorflow_module() -> Any:
    """TensorFlow, imported with its load-time notes kept off the program's output."""
    if importlib.util.find_spec("tensorflow") is None:
        raise ImportError(f"TensorFlow models need the 'tensorflow' package ({EXTRA})")
    os.environ.setdefault(*_LOG_LEVEL)
    with quiet_output((2,)):
        import tensorflow as tf
    return tf


def to_channels_last(images: np.ndarray) -> np.ndarray:
    """An NCHW batch as the NHWC one the converted graph takes."""
    return np.ascontiguousarray(images.transpose(0, 2, 3, 1))


def to_channels_first(outputs: list[np.ndarray]) -> list[np.ndarray]:
    """The converted graph's outputs as the ONNX graph's: its 4-D outputs (NHWC) back to NCHW."""
    return [np.ascontiguousarray(out.transpose(0, 3, 1, 2)) if out.ndim == 4 else out for out in outputs]
