"""Which model does this name? :func:`resolve_model` is the one answer, for ``train``, ``val``, ``predict``,
``export`` and :func:`yolotrain.load`.

A spec is, checked in this order:

- a model in memory: a :class:`~yolotrain.detector.Detector` (a :class:`Yolov5` or an exported runtime);
- an export (``.onnx``, OpenVINO ``.xml``, ``.tflite``, ``.torchscript``, TensorRT ``.engine``): run by its
  runtime; files that are programs (TorchScript, TensorRT) are refused unless ``trust_code``
  (see :mod:`..trust`);
- a model YAML (``.yaml``/``.yml``), YOLOv5's or Ultralytics' anchor-free format: that architecture with random
  weights;
- a published architecture name without a suffix (``yolov5n`` … ``yolov5x6``, ``n``, ``s6``; the anchor-free
  ``yolov5nu``, ``yolov8n`` … ``yolo11x-seg``) that is not a file: that architecture with random weights; likewise a
  classifier's (``yolov5n-cls`` … ``yolov5x-cls``, ``yolov8n-cls``, ``yolo11n-cls`` …, or a torchvision name such as
  ``resnet18``: ImageNet's 1000 classes unless ``names``);
- anything else is weights (see :func:`.pretrained.load_model`): our checkpoints (stem, ``.json`` or
  ``.safetensors`` of a set), a bare ``state_dict``, official YOLOv5 and Ultralytics (``yolov8n.pt``,
  ``yolo11n.pt``, ``yolov5nu.pt`` …) ``.pt`` files (read by the restricted unpickler, never running pickled code),
  a bare official YOLOv5 name (``yolov5s.pt``) downloaded once.

The split: :func:`resolve_model` answers any of these as a :class:`~yolotrain.detector.Detector`, what
evaluation and prediction need; :func:`resolve_trainable` answers a :class:`Yolov5`, what training, export
and :func:`yolotrain.load` need (parameters to train, a graph to trace), refusing exports in one line
before their runtime is started.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from ...checkpoint import CheckpointError, checkpoint_paths
from ...detector import Detector
from ...devices import select_device
from ...model import Yolov5
from ...model.anchor_free import read_model_yaml as read_anchor_free_yaml
from ...model.classify import Classifier, is_torchvision_name, parse_cls_name
from ...model.yolo import parse_version
from ...outputs import Labelled
from ..backends import is_exported, load_exported
from .anchor_free import build_architecture, is_anchor_free_name, is_anchor_free_yaml, published_architecture
from .pretrained import load_model

ModelSource = Detector | str | os.PathLike
MODEL_YAML_SUFFIXES = (".yaml", ".yml")
# The command-line spellings of the weights a command runs (val, predict, track, export): the reference's
# --weights, and --model as Ultralytics' model=.
WEIGHTS_FLAGS = ("--weights", "--model")
# Every name a checkpoint set is given by: NAME, NAME.json, NAME.safetensors, NAME.state.pt.
_SET_SUFFIXES = (".json", ".safetensors", ".state.pt")


def resolve_model(source: ModelSource, *, device: str | None = None, trust_code: bool = False,
                  names: Sequence[str] | None = None, use_ema: bool = True) -> Detector:
    """The detector ``source`` names (see the module's list of specs).

    ``device`` moves a PyTorch model there (None: where it is; files load on the CPU); exports run where
    their runtime runs and take their inputs on the CPU. ``names`` gives the classes of an architecture
    built with random weights (its YAML's ``nc``, or COCO's 80, otherwise); weights keep their own.
    ``use_ema``: the EMA weights of a checkpoint that holds them. A model in memory is returned itself.

    Raises:
        TypeError: ``source`` is neither a detector nor a path.
        ValueError: an unknown architecture name, or a bad model YAML (one line naming ``file:line``).
        yolotrain.checkpoint.CheckpointError: the file is missing or cannot be read as a model.
    """
    if isinstance(source, Detector):
        model = source
    elif not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"expected a Yolov5 model, an exported one or a weights path, got {type(source).__name__}")
    elif is_exported(source):
        return load_exported(source, trust_code=trust_code)
    else:
        model = _torch_model(Path(source), names, use_ema)
    if device is not None and isinstance(model, nn.Module):  # a PyTorch model (an export runs where its runtime does)
        model = model.to(select_device(device))
    return model


def resolve_trainable(source: Yolov5 | Classifier | str | os.PathLike,
                      names: Sequence[str] | None = None) -> Yolov5 | Classifier:
    """The :class:`Yolov5` that ``source`` names, to train or export (on the CPU; a model in memory is
    itself); :func:`yolotrain.load`.

    Raises:
        yolotrain.checkpoint.CheckpointError: ``source`` is an export (it has no trainable weights), or
            as :func:`resolve_model`.
    """
    if isinstance(source, (str, os.PathLike)) and is_exported(source):
        raise CheckpointError(f"{source}: an exported model, not a torch checkpoint: run it with val or predict "
                              "(or yolotrain.resolve_model); train and export take the checkpoint it was exported from")
    model = resolve_model(source, names=names)
    if not isinstance(model, nn.Module):
        raise CheckpointError(f"{type(model).__name__}: an exported model cannot be trained")
    return model


def _torch_model(path: Path, names: Sequence[str] | None, use_ema: bool) -> Yolov5 | Classifier:
    """An architecture (YAML or published name) with random weights, or weights read from a file."""
    num_classes = None if names is None else len(names)
    if path.suffix.lower() in MODEL_YAML_SUFFIXES:
        if path.is_file() and is_anchor_free_yaml(path):
            return build_architecture(read_anchor_free_yaml(path), num_classes, names)
        return Yolov5.from_yaml(path, num_classes=num_classes, names=names)
    if _names_architecture(path) and is_anchor_free_name(path):
        return published_architecture(str(path), num_classes, names)
    if _names_architecture(path) and (parse_cls_name(str(path)) or is_torchvision_name(str(path))):
        return Classifier.from_name(str(path), 1000 if num_classes is None else num_classes, names)
    if _names_architecture(path):
        return Yolov5(parse_version(str(path)), num_classes=80 if num_classes is None else num_classes, names=names)
    return load_model(path, use_ema=use_ema)


def is_published_name(name: str) -> bool:
    """Whether ``name`` is a published architecture of any family (``yolov5s``, ``s6``, ``yolov8n``, ``yolo11n-seg``,
    ``yolov5nu``; classifiers' too)."""
    if is_anchor_free_name(name) or parse_cls_name(name) or is_torchvision_name(name):
        return True
    try:
        parse_version(name)
    except ValueError:
        return False
    return True


def check_published_name(name: str) -> None:
    """Refuse, in one line (``ValueError``), a bare name that is no published architecture of any family."""
    if not is_published_name(name):
        raise ValueError(f"unknown model {name!r}: a YOLOv5 size (yolov5n … yolov5x, n6 … x6, -seg, -cls), an "
                         "anchor-free architecture (yolov5nu …, yolov8n … yolov8x, yolo11n … yolo11x, -seg, -cls), a "
                         "torchvision classifier, a model YAML or a weights file")


def names_architecture(spec: str | os.PathLike) -> bool:
    """Whether ``spec`` is an architecture to build with random weights (a model YAML, or a name such as
    ``yolov5n-seg`` that is no file), rather than weights."""
    path = Path(spec)
    return path.suffix.lower() in MODEL_YAML_SUFFIXES or _names_architecture(path)


def _names_architecture(path: Path) -> bool:
    """Whether ``path`` is a bare name (no folder, no suffix) that is no file and no checkpoint set's stem."""
    return (path.name == str(path) and not path.suffix and not path.exists()
            and not path.with_name(path.name + ".json").is_file())


def weights_inputs(weights: str | os.PathLike) -> list[Labelled]:
    """The files a weights path reads: every member of a checkpoint set (its JSON names the others, and
    its state file is resumed from), an OpenVINO model's ``.bin`` beside its ``.xml``, or the file itself."""
    path = Path(weights)
    if path.suffix == ".xml":
        return [("weights", path), ("weights", path.with_suffix(".bin"))]
    if path.suffix not in ("", *_SET_SUFFIXES) and not path.name.endswith(".state.pt"):
        return [("weights", path)]
    return [("weights", member) for member in (path, *checkpoint_paths(path))]
