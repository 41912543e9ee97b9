"""``load_model``: one entry point for every weights file a user may hold."""

from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoint import CheckpointError, checkpoint_paths, load_checkpoint, state_mismatch
from ..model import Yolov5
from .official import DetectorWeights, UnsupportedCheckpointError, from_state_dict, interpret
from .unpickler import read_torch_file


def build_detector(weights: DetectorWeights, source: str) -> Yolov5:
    """A float32 :class:`Yolov5` in eval mode holding ``weights`` (with ``model.names`` set)."""
    model = Yolov5(weights.architecture, num_classes=weights.nc, anchors=weights.anchors)
    state = {key: value.float() if value.is_floating_point() else value for key, value in weights.state_dict.items()}
    mismatch = state_mismatch(model.state_dict(), state)
    if mismatch:
        raise UnsupportedCheckpointError(f"{source}: {weights.kind} does not have the YOLOv5 v6.0+ layout "
                                         f"({mismatch})")
    model.load_state_dict(state, strict=True)
    model.names = weights.names
    return model.eval()


def _read_safetensors_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: truncated or corrupt safetensors file ({exc})") from None


def load_model(path: str | Path, *, use_ema: bool = True) -> Yolov5:
    """Load a :class:`Yolov5` (eval mode, CPU, float32 unless our checkpoint stored another dtype).

    Accepts our checkpoints (stem, ``.safetensors`` or ``.json`` of a set), a bare ``state_dict``
    (``.pt`` or ``.safetensors``), and official ultralytics YOLOv5 v6.0+ detection checkpoints,
    which are read without running any pickled code (see :mod:`.unpickler`). EMA weights are used
    when present and ``use_ema``. Class names are on ``model.names``.
    """
    path = Path(path)
    weights_path, json_path, _ = checkpoint_paths(path)
    if path.suffix == ".json" or (path.suffix in ("", ".safetensors") and json_path.is_file()):
        return load_checkpoint(path, use_ema=use_ema)[0]
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    if path.suffix == ".onnx":
        raise CheckpointError(f"{path}: ONNX files run through yolotrain.interop.OnnxModel, not as a torch model")
    source = str(path)
    if path.suffix == ".safetensors":
        return build_detector(from_state_dict(_read_safetensors_state(path), source), source)
    return build_detector(interpret(read_torch_file(path), source, use_ema=use_ema), source)
