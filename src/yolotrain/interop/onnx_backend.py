"""Run an exported ONNX detector with onnxruntime behind the same call shape as :class:`Yolov5`."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..checkpoint import CheckpointError
from ..model import Detect
from .export import DECODED_OUTPUT, EXPORT_PACKAGES_HINT


class OnnxModel:
    """An ONNX file written by :func:`~yolotrain.interop.export.export`, run with onnxruntime.

    ``model(imgs)`` takes ``[B, 3, H, W]`` float images (0..1) and returns the decoded
    ``[B, N, 5+nc]`` output on the images' device, like ``Yolov5.eval()``. ``names``, ``stride``,
    ``num_classes`` and ``img_size`` come from the file's metadata.
    """

    def __init__(self, path: str | Path, providers: list[str] | None = None) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise ImportError(f"running ONNX models needs 'onnxruntime' ({EXPORT_PACKAGES_HINT})") from None
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path}: no such file")
        try:
            self.session = onnxruntime.InferenceSession(str(self.path), providers=providers or ["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own unexported exception types
            raise CheckpointError(f"{self.path}: not a loadable ONNX model ({str(exc).splitlines()[0]})") from None
        meta = self.session.get_modelmeta().custom_metadata_map
        if meta.get("producer") != "yolotrain":
            raise CheckpointError(
                f"{self.path}: ONNX file without yolotrain metadata (export it with yolotrain export)")
        self.num_classes = int(meta["nc"])
        self.names: list[str] = json.loads(meta["names"])
        self.stride = torch.tensor(json.loads(meta["stride"]), dtype=torch.float32)
        self.img_size: tuple[int, int] = tuple(json.loads(meta["img_size"]))
        self.raw: bool = json.loads(meta["raw"])
        self.input = self.session.get_inputs()[0]
        # Raw exports leave decoding to the caller; Detect owns that maths, so reuse it (its 1-channel
        # convolutions are never run).
        levels = len(self.stride)
        self._decoder = Detect(self.num_classes, torch.tensor(json.loads(meta["anchors"])), (1,) * levels,
                               tuple(int(s) for s in self.stride.tolist())) if self.raw else None

    def _check(self, imgs: torch.Tensor) -> None:
        expected = self.input.shape  # ints for fixed axes, names for dynamic ones
        if imgs.ndim != 4 or any(isinstance(e, int) and e != s for e, s in zip(expected, imgs.shape)):
            raise ValueError(f"{self.path.name} expects images of shape {list(expected)}, got {list(imgs.shape)}")

    def __call__(self, imgs: torch.Tensor) -> torch.Tensor:
        """Decoded ``[B, N, 5+nc]`` predictions for ``imgs`` ``[B, 3, H, W]``."""
        self._check(imgs)
        feed = {self.input.name: imgs.detach().to("cpu", torch.float32).numpy()}
        outputs = [torch.from_numpy(o) for o in self.session.run(None, feed)]
        if self._decoder is not None:
            decoded = self._decoder.decode(outputs)
        else:
            decoded = outputs[[o.name for o in self.session.get_outputs()].index(DECODED_OUTPUT)]
        return decoded.to(imgs.device)

    def __repr__(self) -> str:
        return f"OnnxModel({str(self.path)!r}, nc={self.num_classes}, img_size={self.img_size})"
