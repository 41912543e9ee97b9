"""Turn a model or a weights path into an inference-ready :class:`~yolotrain.detector.Detector` on a device."""

from __future__ import annotations

import copy
import itertools
import os
import weakref
from collections.abc import Sequence

import torch
from torch import nn

from ..detector import Detector
from ..devices import native_bf16, native_half, select_device
from ..interop.backends import is_exported
from ..interop.loading.resolve import ModelSource, resolve_model, weights_inputs
from ..outputs import Labelled
from ..task import task_of
from .slicing import SlicedDetector, slice_settings_refusal
from .tta import AugmentedDetector, EnsembleDetector, _Composite

ModelOrWeights = ModelSource
# One model, or several making an ensemble (the reference's several --weights).
ModelsOrWeights = ModelOrWeights | Sequence[ModelOrWeights]
# The --weights help of val and predict: every file resolve_model takes.
WEIGHTS_HELP = ("checkpoint, official YOLOv5 or Ultralytics .pt (yolov8n.pt ...), or an export (.onnx, OpenVINO .xml, "
                ".tflite, .torchscript, TensorRT .engine; TorchScript and TensorRT files need --trust-model-code)")
# --trust-model-code of val and predict.
TRUST_HELP = ("load model files that are programs (.torchscript, TensorRT .engine): they run their own code "
              "when loaded, so only for files from a source you trust")


def one_weights(weights: Sequence[str]) -> str:
    """The one file of ``--weights``; the reference's several (an ensemble of models) are refused."""
    if len(weights) != 1:
        raise ValueError(f"--weights: {len(weights)} files make an ensemble (their detections merged), which is "
                         "not supported; give one weights file")
    return weights[0]


def weights_argument(weights: Sequence[str]) -> str | list[str]:
    """What ``--weights`` names for ``val`` and ``predict``: one file, or several making an ensemble."""
    return weights[0] if len(weights) == 1 else list(weights)


def weights_files(models_or_weights: ModelsOrWeights) -> list[Labelled]:
    """The files the weights paths among ``models_or_weights`` read (see
    :func:`~yolotrain.interop.loading.resolve.weights_inputs`); models in memory read none."""
    sources = models_or_weights if isinstance(models_or_weights, (list, tuple)) else [models_or_weights]
    return [item for source in sources if isinstance(source, (str, os.PathLike)) for item in weights_inputs(source)]


def load_inference_model(models_or_weights: ModelsOrWeights, device: str | torch.device | None = None,
                         fuse: bool = True, half: bool | None = None, trust_code: bool = False,
                         augment: bool = False, slice: int | None = None,
                         slice_overlap: float = 0.2, reuse_copy: bool = False) -> tuple[Detector, torch.device]:
    """:func:`load_one_model` for one model or weights path; for a list of several, the reference's
    ensemble of them (:class:`~yolotrain.eval.tta.EnsembleDetector`: their predictions merged before NMS).
    ``augment`` runs each detection model with the reference's test-time augmentation
    (:class:`~yolotrain.eval.tta.AugmentedDetector`). ``slice`` (a tile side in px; None or 0: off) runs the
    whole on overlapping tiles of the input, ``slice_overlap`` of a tile apart at least
    (:class:`~yolotrain.eval.slicing.SlicedDetector`). ``reuse_copy``: see :func:`load_one_model`.

    Raises:
        ValueError: ``augment`` for a model other than a PyTorch detection model, ``slice`` for one other than
            a PyTorch detection or segmentation model; ``slice`` or
            ``slice_overlap`` out of range; an ensemble with an export,
            a classifier or a segmentation model in it, or of models predicting different classes.
    """
    sources = list(models_or_weights) if isinstance(models_or_weights, (list, tuple)) else [models_or_weights]
    if not sources:
        raise ValueError("no model to run: give one or more weights files")
    if (refusal := slice_settings_refusal(slice, slice_overlap)) is not None:
        raise ValueError(refusal)
    if len(sources) > 1:
        for source in sources:  # before any runtime is started
            if isinstance(source, (str, os.PathLike)) and is_exported(source):
                raise ValueError(_export_in_ensemble(source))
    loaded = [load_one_model(source, device, fuse, half, trust_code, reuse_copy) for source in sources]
    for source, (model, _) in zip(sources, loaded):
        if len(sources) > 1:
            _check_ensemble_member(model, source)
        elif augment:
            _check_wrappable(model, source, "--augment")
        if slice:
            _check_wrappable(model, source, "--slice")
    models = [AugmentedDetector(model) if augment else model for model, _ in loaded]
    if len(models) == 1:
        return (SlicedDetector(models[0], slice, slice_overlap) if slice else models[0]), loaded[0][1]
    first, first_source = loaded[0][0], sources[0]
    for source, (model, _) in zip(sources[1:], loaded[1:]):
        if model.names != first.names:
            raise ValueError(f"an ensemble's models must predict the same classes: {_name(first_source)} predicts "
                             f"{first.num_classes} ({_first_names(first.names)}), {_name(source)} "
                             f"{model.num_classes} ({_first_names(model.names)})")
        if (model.device, model.dtype) != (first.device, first.dtype):
            raise ValueError(f"an ensemble's models must run on one device in one precision: {_name(first_source)} "
                             f"is {first.dtype} on {first.device}, {_name(source)} {model.dtype} on {model.device}")
    ensemble = EnsembleDetector(models)
    return (SlicedDetector(ensemble, slice, slice_overlap) if slice else ensemble), loaded[0][1]


def _name(source: ModelOrWeights) -> str:
    return str(source) if isinstance(source, (str, os.PathLike)) else f"the {type(source).__name__} given"


def _first_names(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _check_wrappable(model: Detector, source: ModelOrWeights, option: str) -> None:
    """``--augment`` (the reference's test-time augmentation: three scales) and ``--slice`` (batches of tiles)
    run PyTorch models of the tasks that take them: the task refuses its own (test-time augmentation loses a
    segmentation model's prototypes, a classifier has no boxes), and an export is fixed at one size or batch."""
    task = task_of(model)
    refusal = task.augment_refusal(_name(source)) if option == "--augment" else task.slicing_refusal(_name(source))
    if refusal is not None:
        raise ValueError(refusal)
    if not task.is_pytorch_model(model):
        how = "at three scales" if option == "--augment" else "on batches of tiles"
        raise ValueError(f"{option} runs PyTorch models {how}: {_name(source)} is an export; give its "
                         "checkpoint or .pt")


def _check_ensemble_member(model: Detector, source: ModelOrWeights) -> None:
    """The reference's ensembles: PyTorch detection models (its Ensemble drops a segmentation model's
    prototype masks, and has no meaning for classifiers)."""
    task = task_of(model)
    if (refusal := task.ensemble_refusal(_name(source))) is not None:
        raise ValueError(refusal)
    if not task.is_pytorch_model(model):
        raise ValueError(_export_in_ensemble(source))


def _export_in_ensemble(source: ModelOrWeights) -> str:
    return (f"an ensemble (several --weights) runs PyTorch models (checkpoints, official .pt) side by side: "
            f"{_name(source)} is an export; give its checkpoint or .pt")


def load_one_model(model_or_weights: ModelOrWeights, device: str | torch.device | None = None,
                   fuse: bool = True, half: bool | None = None, trust_code: bool = False,
                   reuse_copy: bool = False) -> tuple[Detector, torch.device]:
    """The detector :func:`~yolotrain.interop.loading.resolve.resolve_model` finds for ``model_or_weights``, ready
    for inference, and the device its inputs go to. Exports (``.onnx``, OpenVINO ``.xml``, ``.tflite``,
    ``.torchscript``; TensorRT ``.engine`` on the GPU) run through their runtimes as they are, fed from the
    CPU; TorchScript files and TensorRT engines run their own code when loaded: they are refused unless
    ``trust_code`` (see :mod:`yolotrain.interop.trust`). A PyTorch model goes in eval mode to ``device``
    (by default: where a given model is; the best device for a file).

    The caller's model is never changed: fusing Conv+BN (faster inference, same outputs), the
    channels-last layout and the move to ``device``/half precision happen on a copy. With ``reuse_copy`` (what
    ``predict`` asks for) the copy made for a model is kept beside it and given again while the model's weights
    are unchanged (:func:`_prepared_copy`): a program calling ``predict(model, frame)`` per frame pays the copy
    once, not per call (about 80 ms for a yolo11n on the CPU, more than its forward pass). ``half`` means
    float16 on CUDA (as the reference) and bfloat16 on the CPU, where oneDNN runs bf16 convolutions
    natively on processors with AVX512-BF16/AMX; ``None`` (auto) is half precision where the device
    computes it natively (:func:`~yolotrain.devices.native_half`), float32 elsewhere. bf16 head maps are
    decoded in float32 (8 significant bits would move boxes by pixels); fp16 ones in fp16, as the
    reference does.

    Raises:
        TypeError: ``model_or_weights`` is neither a detector nor a path.
        yolotrain.checkpoint.CheckpointError: the weights file cannot be read.
    """
    model = resolve_model(model_or_weights, trust_code=trust_code)
    if not task_of(model).is_pytorch_model(model):
        return model, model.device
    given = model is model_or_weights
    dev = model.device if given and device is None else select_device(device)
    dtype = inference_dtype(half, dev) or torch.float32
    if given and reuse_copy:
        return _prepared_copy(model, dev, dtype, fuse), dev
    return _prepared(copy.deepcopy(model) if given else model, dev, dtype, fuse), dev


def _prepared(model: Detector, dev: torch.device, dtype: torch.dtype, fuse: bool) -> Detector:
    """``model`` itself (a copy or a freshly loaded file) made ready for inference."""
    model = model.to(dev, torch.float32).eval()  # BatchNorm folds in float32
    if fuse:
        model.fuse()
    # NHWC is the layout oneDNN and cuDNN convolutions run fastest in (measured on yolov5n at 640:
    # 1.2x on the CPU); the outputs are the same up to float rounding. One pass over the tensors for
    # the layout and the precision.
    model = model.to(dtype=dtype, memory_format=torch.channels_last)
    for p in model.parameters():
        p.requires_grad_(False)
    _activations_in_place(model)
    return model


# A caller's model -> {its settings (device, dtype, fuse): (weights state, their norms, the inference-ready copy made
# for them)}; the entries go with their model.
_PREPARED_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[tuple, tuple[tuple, torch.Tensor, Detector]]] = (
    weakref.WeakKeyDictionary())


def _prepared_copy(model: Detector, dev: torch.device, dtype: torch.dtype, fuse: bool) -> Detector:
    """The copy of ``model`` prepared for inference with these settings, made again only when the weights changed.

    Unchanged means: the same tensors (storage and version counters: an optimiser step, ``load_state_dict``,
    ``copy_`` or an EMA update each bump a counter), the same norm of each (a write through ``.data`` bumps no
    counter, but moves a norm) and the same class names. One copy is kept per device, precision and fusing asked
    for (a program predicting in float32 and bfloat16 in turn keeps two).
    """
    settings = (dev, dtype, fuse)
    tensors = [t for t in itertools.chain(model.parameters(), model.buffers()) if t.is_floating_point()]
    state = (tuple((t.data_ptr(), t._version) for t in tensors), repr(getattr(model, "names", None)))
    with torch.no_grad():
        # One fused kernel over every tensor (a loop of per-tensor norms costs as much as the copy it saves).
        norms = torch.stack(torch._foreach_norm(tensors)) if tensors else torch.empty(0)
    copies = _PREPARED_COPIES.setdefault(model, {})
    kept = copies.get(settings)
    if kept is not None and kept[0] == state and torch.equal(kept[1], norms):
        return kept[2]
    prepared = _prepared(copy.deepcopy(model), dev, dtype, fuse)
    copies[settings] = (state, norms, prepared)
    return prepared


def inference_dtype(half: bool | None, device: torch.device) -> torch.dtype | None:
    """The reduced precision a PyTorch model runs in on ``device`` (None: float32): ``half`` true means
    float16 on CUDA and bfloat16 elsewhere; None (auto) the device's native half precision, if any."""
    if half is None:
        return native_half(device)
    return (torch.float16 if device.type == "cuda" else torch.bfloat16) if half else None


def precision_line(model: Detector, device: torch.device) -> str | None:
    """The line ``val`` and ``predict`` open with when they chose the precision (``--half auto``): what
    the PyTorch model runs in and why; None for an export, which runs in the precision it was saved in."""
    if isinstance(model, _Composite):
        model = model.first
    if not task_of(model).is_pytorch_model(model):
        return None
    dtype = next(model.parameters()).dtype
    name = str(dtype).removeprefix("torch.")
    if dtype == torch.float32:
        why = ("--half auto: this CPU has no native bfloat16 instructions" if device.type == "cpu"
               else "--half auto")
        return f"Precision: float32 on {device.type} ({why})"
    native = f": native on this CPU ({native_bf16()})" if device.type == "cpu" else ""
    return f"Precision: {name} on {device.type} (--half auto{native}; --no-half for float32)"


def _activations_in_place(model: nn.Module) -> None:
    """Let every SiLU overwrite its input: inference keeps nothing for a backward pass, and each SiLU
    here reads a freshly computed Conv/BatchNorm output, so this saves one feature-map allocation and
    pass over memory per convolution with bit-identical outputs (the reference runs its SiLUs in place too).
    """
    for module in model.modules():
        if isinstance(module, nn.SiLU):
            module.inplace = True
