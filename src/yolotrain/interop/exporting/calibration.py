"""Post-training quantization helpers: calibration images from a dataset, and which part of an exported
graph must stay in floating point.

The part that always stays is the *decode tail*: everything between the head's last convolutions and
the outputs (sigmoid, grid offsets, anchor scaling, and NMS when it is built in). Its single output
holds pixel coordinates (0..640) next to probabilities (0..1); one 8-bit scale for both would move
boxes by pixels and round scores to multiples of 1/255, so quantizers are told to leave it alone.
onnxruntime int8 exports also keep the head's convolutions, the layers that feed them and the stem in
float (:func:`onnx_int8_float_nodes`; measured in docs/int8.md); LiteRT int8
exports keep the head's convolutions (:data:`TFLITE_FLOAT_SCOPES`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np

from ...data.augment import letterbox
from ...data.sources import IMG_FORMATS, list_images, resolve_source
from ...model import Detect

if TYPE_CHECKING:
    import onnx
    import openvino

DEFAULT_CALIBRATION_IMAGES = 300
# The AI Edge Quantizer matches a regex against each LiteRT op's scope, the module path of the PyTorch
# code that made it ("..._ExportGraph/yolotrain.model.detect.Detect_24/torch.nn.modules.conv.Conv2d_1").
# The head's ops carry the Detect module in their scope; the decode tail, traced from the export
# graph's own forward, sits at the top level with no "/" in its scope.
TFLITE_FLOAT_SCOPES = rf"\.{Detect.__name__}_\d+|^[^/]*$"


def calibration_files(data: str | os.PathLike, limit: int = DEFAULT_CALIBRATION_IMAGES) -> list[Path]:
    """Up to ``limit`` images for calibration: a dataset's train split (its val split when it has no
    train images), or the images of a plain folder. Raises ``ValueError`` when there are none."""
    if limit <= 0:
        raise ValueError(f"the number of calibration images must be positive, got {limit}")
    path = Path(data)
    if not path.exists():
        raise ValueError(f"calibration data {data}: no such file or folder")
    plain_folder = path.is_dir() and any(p.suffix[1:].lower() in IMG_FORMATS for p in path.iterdir())
    if plain_folder:
        files = list_images(path)
    else:
        try:
            with warnings.catch_warnings():
                # "no val split" notes do not matter here: calibration reads the train split.
                warnings.simplefilter("ignore", UserWarning)
                source = resolve_source(path)
        except (FileNotFoundError, ValueError, KeyError) as exc:
            raise ValueError(f"calibration data {data}: no images to calibrate on ({exc})") from None
        files = source.train or source.val
    if not files:
        raise ValueError(f"calibration data {data}: no images to calibrate on")
    return sorted(files)[:limit]


def calibration_batch(file: Path, size: tuple[int, int]) -> np.ndarray:
    """One image as the exported model sees it: letterboxed to ``size`` (h, w), RGB, float32 0..1, NCHW."""
    image = cv2.imread(str(file))
    if image is None:
        raise ValueError(f"calibration image {file} cannot be read")
    boxed, _, _ = letterbox(image, size, scaleup=True)
    rgb = cv2.cvtColor(boxed, cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(rgb.transpose(2, 0, 1)[None], dtype=np.float32) / 255


class CalibrationImages:
    """Calibration inputs read lazily (300 images at 640 px would be 1.5 GB held at once); iterable
    any number of times, as NNCF's bias correction needs."""

    def __init__(self, files: list[Path], size: tuple[int, int]) -> None:
        self.files, self.size = files, size

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[np.ndarray]:
        return (calibration_batch(f, self.size) for f in self.files)


def onnx_decode_tail(proto: onnx.ModelProto) -> list[str]:
    """Names of the ONNX nodes from the last convolutions to the outputs (see the module docstring)."""
    producers = {out: node for node in proto.graph.node for out in node.output}
    tail, pending, seen = [], [o.name for o in proto.graph.output], set()
    while pending:
        node = producers.get(pending.pop())
        if node is None or node.name in seen or node.op_type in ("Conv", "QLinearConv", "ConvInteger"):
            continue
        seen.add(node.name)
        tail.append(node.name)
        pending.extend(node.input)
    return tail


def onnx_int8_float_nodes(proto: onnx.ModelProto) -> list[str]:
    """Names of the ONNX nodes an int8 export keeps in float: the decode tail; the head's output
    convolutions (their outputs become box coordinates) and the convolution with activation feeding
    each of them; and the stem, the first convolution with its activation."""
    tail = onnx_decode_tail(proto)
    producers = {out: node for node in proto.graph.node for out in node.output}
    consumers: dict[str, list] = {}
    for node in proto.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    tail_names = set(tail)
    ends = [name for node in proto.graph.node if node.name in tail_names for name in node.input]
    head = [producers[name] for name in dict.fromkeys(ends + [o.name for o in proto.graph.output])
            if name in producers and producers[name].op_type == "Conv"]

    feeding, pending = [], [head_conv.input[0] for head_conv in head]
    while pending:  # back from each head convolution's input to the convolution before it
        node = producers.get(pending.pop())
        if node is None or node.name in feeding:
            continue
        feeding.append(node.name)
        if node.op_type != "Conv":
            pending.extend(node.input)

    stem, pending = [], [proto.graph.input[0].name]
    while pending:  # forward from the input to the second convolution
        for node in consumers.get(pending.pop(), []):
            if node.name in stem or (node.op_type == "Conv" and stem):
                continue
            stem.append(node.name)
            pending.extend(node.output)
    return list(dict.fromkeys(tail + [n.name for n in head] + feeding + stem))


def openvino_decode_tail(model: openvino.Model) -> list[str]:
    """Friendly names of the OpenVINO operations from the last convolutions to the results."""
    tail, pending, seen = [], [result for result in model.get_results()], set()
    while pending:
        op = pending.pop()
        if op.get_friendly_name() in seen or op.get_type_name() == "Convolution":
            continue
        seen.add(op.get_friendly_name())
        if op.get_type_name() not in ("Result", "Constant", "Parameter"):
            tail.append(op.get_friendly_name())
        pending.extend(value.get_node() for value in op.input_values())
    return tail


class OnnxCalibrationReader:
    """onnxruntime's ``CalibrationDataReader`` protocol over :class:`CalibrationImages`."""

    def __init__(self, images: Iterable[np.ndarray], input_name: str) -> None:
        self._batches = iter(images)
        self.input_name = input_name

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        return None if batch is None else {self.input_name: batch}


class TfliteCalibrationInputs:
    """:class:`CalibrationImages` as the ``{input name: image}`` dicts the AI Edge Quantizer reads; it
    walks them twice (counting, then calibrating), so this is iterable any number of times."""

    def __init__(self, images: CalibrationImages, input_name: str) -> None:
        self.images, self.input_name = images, input_name

    def __len__(self) -> int:
        return len(self.images)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return ({self.input_name: image} for image in self.images)
