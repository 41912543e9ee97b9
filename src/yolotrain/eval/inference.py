"""Turn a model or a weights path into an inference-ready detector on a device, with class names."""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..devices import select_device
from ..model import Yolov5

ModelOrWeights = nn.Module | str | os.PathLike
# A torch detector, or an exported one run by its runtime (``yolotrain.interop.ExportedModel``).
Detector = Any
# The --weights help of val and predict: every file load_inference_model takes.
WEIGHTS_HELP = ("checkpoint, official YOLOv5 .pt, or an export (.onnx, OpenVINO .xml, .tflite, .torchscript, "
                "TensorRT .engine; TorchScript and TensorRT files need --trust-model-code)")
# --trust-model-code of val and predict.
TRUST_HELP = ("load model files that are programs (.torchscript, TensorRT .engine): they run their own code "
              "when loaded, so only for files from a source you trust")


def one_weights(weights: Sequence[str]) -> str:
    """The one file of ``--weights``; the reference's several (an ensemble of models) are refused."""
    if len(weights) != 1:
        raise ValueError(f"--weights: {len(weights)} files make an ensemble (their detections merged), which is "
                         "not supported; give one weights file")
    return weights[0]


def input_dtype(model: Detector) -> torch.dtype:
    """The dtype images must have for ``model`` (exported models take float32)."""
    return next(model.parameters()).dtype if isinstance(model, nn.Module) else torch.float32


def load_inference_model(model_or_weights: ModelOrWeights, device: str | torch.device | None = None,
                         fuse: bool = True, half: bool = False,
                         trust_code: bool = False) -> tuple[Detector, torch.device]:
    """A detector in eval mode on ``device``: a copy of the given :class:`Yolov5`, or one loaded from a
    weights path (our checkpoints and official YOLOv5 ``.pt`` files, via :func:`yolotrain.interop.load_model`;
    exports (``.onnx``, OpenVINO ``.xml``, ``.tflite``, ``.torchscript``; TensorRT ``.engine`` on the GPU)
    run through their runtimes, fed from the CPU). TorchScript files and TensorRT engines run their own
    code when loaded: they are refused unless ``trust_code`` (see :mod:`yolotrain.interop.trust`).

    The caller's model is never changed: fusing Conv+BN (faster inference, same outputs), the
    channels-last layout and the move to ``device``/half precision happen on a copy. ``half`` means
    float16 on CUDA (as the reference) and bfloat16 on the CPU, where oneDNN runs bf16 convolutions
    natively on processors with AVX512-BF16/AMX. bf16 head maps are decoded in float32 (8 significant
    bits would move boxes by pixels); fp16 ones in fp16, as the reference does.

    Raises:
        TypeError: ``model_or_weights`` is neither a :class:`Yolov5` nor a path.
        yolotrain.checkpoint.CheckpointError: the weights file cannot be read.
    """
    if isinstance(model_or_weights, (str, os.PathLike)):
        from ..interop.runtime import is_exported, load_exported

        if is_exported(model_or_weights):
            return load_exported(model_or_weights, trust_code=trust_code), torch.device("cpu")
    if isinstance(model_or_weights, (str, os.PathLike)):
        from ..interop import load_model

        model = load_model(Path(model_or_weights))
    elif isinstance(model_or_weights, Yolov5):
        model = copy.deepcopy(model_or_weights)
    else:
        raise TypeError(f"expected a Yolov5 model or a weights path, got {type(model_or_weights).__name__}")
    dev = select_device(device) if device is not None or isinstance(model_or_weights, (str, os.PathLike)) \
        else next(model.parameters()).device
    model = model.to(dev).float().eval()
    if fuse:
        model.fuse()
    # NHWC is the layout oneDNN and cuDNN convolutions run fastest in (measured on yolov5n at 640:
    # 1.2x on the CPU); the outputs are the same up to float rounding.
    model = model.to(memory_format=torch.channels_last)
    if half:
        model.to(torch.float16 if dev.type == "cuda" else torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    _activations_in_place(model)
    return model, dev


def _activations_in_place(model: nn.Module) -> None:
    """Let every SiLU overwrite its input: inference keeps nothing for a backward pass, and each SiLU
    here reads a freshly computed Conv/BatchNorm output, so this saves one feature-map allocation and
    pass over memory per convolution with bit-identical outputs (the reference runs its SiLUs in place too).
    """
    for module in model.modules():
        if isinstance(module, nn.SiLU):
            module.inplace = True
