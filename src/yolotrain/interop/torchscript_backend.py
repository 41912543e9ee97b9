"""Run a TorchScript export (``.torchscript``) behind the call shape of :class:`Yolov5`."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from ..checkpoint import CheckpointError
from .runtime import ExportedModel
from .trust import require_trust


class TorchScriptModel(ExportedModel):
    """A ``.torchscript`` file written by :func:`~yolotrain.interop.export.export`, run by the TorchScript
    interpreter on the CPU. The graph was traced at batch 1 and one image size, so batches run one
    image at a time. Loading a TorchScript archive runs no pickled Python code, but the archive's own
    TorchScript code runs: it is refused unless ``trust_code`` (see :mod:`.trust`)."""

    format_name = "TorchScript"

    def __init__(self, path: str | os.PathLike, trust_code: bool = False) -> None:
        path = Path(path)
        require_trust(path, trust_code)
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        extra = {"config.json": ""}
        try:
            with warnings.catch_warnings():  # TorchScript is deprecated upstream; this file was asked for
                warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
                self.module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra).eval()
        except RuntimeError as exc:
            raise CheckpointError(f"{path}: not a loadable TorchScript model ({str(exc).splitlines()[0]})") from None
        try:
            metadata = json.loads(extra["config.json"] or "{}")
        except json.JSONDecodeError:
            metadata = {}
        size = json.loads(metadata["img_size"]) if "img_size" in metadata else [None, None]
        super().__init__(path, metadata, [1, 3, *size])

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        # Channels-last input, as our PyTorch inference uses: oneDNN's NHWC convolutions are faster on
        # the CPU (yolov5n at 640: ~32 ms against ~41 ms), and the layout carries through the graph.
        batch = torch.from_numpy(images).contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            outputs = self.module(batch)
        return [o.numpy() for o in (outputs if isinstance(outputs, (tuple, list)) else (outputs,))]
