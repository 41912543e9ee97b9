"""Image classifiers: the YOLOv5-cls models (a detector's backbone cut where the reference cuts it, with its
``Classify`` head) and torchvision models by name with their head resized, behind one :class:`Classifier`.

``model(imgs)`` takes ``[B, 3, H, W]`` images normalised with the ImageNet mean and standard deviation
(see :mod:`yolotrain.data.classify`) and returns class logits ``[B, nc]`` in every mode. ``model.model``
holds the layers under the reference's names (``model.0.conv.weight`` … ``model.9.linear.weight``), so a
reference ``ClassificationModel`` state dict loads unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import singledispatch

import torch
from torch import nn

from ..detector import Task
from ..settings import setting
from .blocks import Conv, fuse_convs
from .layered import PRECISIONS
from .spec import MAX_CLASSES, build_layers, builtin_spec
from .yolo import Yolov5, parse_version

# The reference cuts a detector after its SPPF stage: layers 0-8 stay, layer 9 becomes the Classify head.
DEFAULT_CUTOFF = 10
# Channels of the Classify head's 1x1 convolution (the reference's efficientnet_b0-sized feature).
HEAD_CHANNELS = 1280
# Input size the published classifiers are trained and evaluated at.
CLASSIFY_IMG_SIZE = 224
# torchvision architectures offered by name (``weights=None``: nothing is ever downloaded).
TORCHVISION_PREFIXES = ("resnet", "resnext", "wide_resnet", "efficientnet", "mobilenet", "regnet", "convnext",
                        "densenet", "shufflenet", "squeezenet", "mnasnet", "vgg", "alexnet", "googlenet")
CLS_SUFFIX = "-cls"


@dataclass(frozen=True)
class ClassifyConfig:
    """How a classifier is made from the model a run names (the reference's ``classify/train.py`` options)."""

    cutoff: int = setting(DEFAULT_CUTOFF, "layer of a YOLOv5 detector replaced by the Classify head (10: after "
                          "SPPF)", min=2)
    dropout: float | None = setting(None, "dropout probability of every Dropout layer of the classifier "
                                    "(unset: as built)", min=0, max=1)


def set_dropout(model: nn.Module, probability: float) -> None:
    """Every ``nn.Dropout`` of ``model`` drops with ``probability`` (the reference's ``--dropout``)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = probability


class Classify(nn.Module):
    """The reference's classification head: 1x1 Conv to 1280 channels, global average pool, dropout, Linear.

    Its BatchNorm keeps PyTorch's defaults (eps 1e-5, momentum 0.1): the reference builds the head after
    re-initialising the detector's BatchNorms, so its checkpoints were trained with them.
    """

    output_layer = "linear"  # the attribute holding the layer that gives the class logits (resize_head's)

    def __init__(self, c_in: int, num_classes: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.conv = Conv(c_in, HEAD_CHANNELS, 1)
        self.conv.bn = nn.BatchNorm2d(HEAD_CHANNELS)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(p=dropout)
        self.linear = nn.Linear(HEAD_CHANNELS, num_classes)

    def forward(self, x: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        if isinstance(x, list):
            x = torch.cat(x, 1)
        return self.linear(self.drop(self.pool(self.conv(x)).flatten(1)))


def _check_num_classes(num_classes: int) -> int:
    if isinstance(num_classes, bool) or not 1 <= int(num_classes) <= MAX_CLASSES:
        raise ValueError(f"num_classes must be from 1 to {MAX_CLASSES}, got {num_classes}")
    return int(num_classes)


def _layer_channels(layer: nn.Module) -> int:
    """Input channels of a backbone layer (a Conv, or a block whose first Conv is ``cv1``)."""
    first = layer.conv if isinstance(getattr(layer, "conv", None), nn.Conv2d) else getattr(layer, "cv1", None)
    if first is None:
        raise ValueError(f"cannot cut a detector at a {type(layer).__name__} layer (needs a Conv, C3 or SPPF)")
    return (first.conv if isinstance(first, Conv) else first).in_channels


def yolo_layers(detector: Yolov5, num_classes: int, cutoff: int = DEFAULT_CUTOFF,
                dropout: float = 0.0) -> nn.Sequential:
    """The reference's ``ClassificationModel._from_detection_model``: layers ``0 … cutoff-2`` of ``detector``
    (shared, not copied) and a :class:`Classify` head in place of layer ``cutoff-1``, fed what that layer took."""
    _check_cutoff(cutoff, len(detector.model))
    return _cut(list(detector.model), detector.layer_inputs, num_classes, cutoff, dropout)


def published_layers(version: str, num_classes: int, cutoff: int = DEFAULT_CUTOFF, dropout: float = 0.0,
                     empty: bool = False) -> nn.Sequential:
    """``yolo_layers(Yolov5(version, num_classes=1), ...)`` without building the layers the cut drops; with
    ``empty``, left on the "meta" device without their random initialisation (weights are about to be
    assigned: initialising even the kept layers costs more than reading a classifier's weights)."""
    spec = builtin_spec(parse_version(version))
    _check_cutoff(cutoff, len(spec.layers))
    anchors = torch.tensor(spec.anchors, dtype=torch.float32).view(len(spec.anchors), -1, 2)
    # Layers 0 … cutoff-1 on the meta device (layer cutoff-1 only gives the head its input channels).
    built = build_layers(spec, 1, anchors, spec.in_channels, build=False, stop=cutoff)
    with torch.device("meta"):
        layers = _cut(built.modules, built.inputs, num_classes, cutoff, dropout)
    if not empty:
        _initialise(layers)
    return layers


def _initialise(model: nn.Module) -> None:
    """Real tensors for a model built on the meta device, initialised as its layers' constructors initialise
    them (Conv2d, BatchNorm2d and Linear: ``reset_parameters``, called in the order they were built, so that
    the random draws are the ones a real build makes)."""
    model.to_empty(device="cpu")
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.BatchNorm2d, nn.Linear)):
            module.reset_parameters()


def _check_cutoff(cutoff: int, layers: int) -> None:
    if not 2 <= cutoff <= layers - 1:
        raise ValueError(f"cutoff must be from 2 to {layers - 1} (layers before Detect), got {cutoff}")


def _cut(layers: Sequence[nn.Module], inputs: Sequence[int | list[int]], num_classes: int, cutoff: int,
         dropout: float) -> nn.Sequential:
    """Layers ``0 … cutoff-2`` of a detector's ``layers`` (taking ``inputs``) and a Classify head in place of
    layer ``cutoff-1``; layers after ``cutoff-1`` are not needed."""
    inputs = inputs[:cutoff]
    if any(source != i - 1 for i, source in enumerate(inputs) if i):
        raise ValueError(f"cannot cut at layer {cutoff}: the layers before it are not one chain "
                         f"(inputs {list(inputs)}); choose a cutoff inside the backbone")
    head = Classify(_layer_channels(layers[cutoff - 1]), num_classes, dropout)
    return nn.Sequential(*layers[:cutoff - 1], head)


def last_linear(model: nn.Module) -> tuple[nn.Module, str, nn.Module] | None:
    """(parent, attribute, layer) of the classifier's output layer, found as the reference's
    ``reshape_classifier_output`` finds it: the layer a head names as its ``output_layer`` (a Classify head's
    ``linear``), a last ``nn.Linear``, or the first Linear (else Conv2d) of a last ``nn.Sequential``."""
    name, last = list(model.named_children())[-1]
    output_layer = getattr(last, "output_layer", None)
    if isinstance(output_layer, str):
        return last, output_layer, getattr(last, output_layer)
    if isinstance(last, nn.Linear):
        return model, name, last
    if isinstance(last, nn.Sequential):
        for kind in (nn.Linear, nn.Conv2d):
            index = next((i for i, m in enumerate(last) if isinstance(m, kind)), None)
            if index is not None:
                return last, str(index), last[index]
    return None


def resize_head(model: nn.Module, num_classes: int) -> bool:
    """Replace the output layer of ``model`` by a freshly initialised one with ``num_classes`` outputs when
    its count differs (the reference's ``reshape_classifier_output``); returns whether it changed."""
    found = last_linear(model)
    if found is None:
        raise ValueError(f"{type(model).__name__}: no Linear or Conv2d output layer to resize")
    parent, attribute, layer = found
    outputs = layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels
    if outputs == num_classes:
        return False
    if isinstance(layer, nn.Linear):
        new = nn.Linear(layer.in_features, num_classes)
    else:
        new = nn.Conv2d(layer.in_channels, num_classes, layer.kernel_size, layer.stride, bias=layer.bias is not None)
    new = new.to(device=layer.weight.device, dtype=layer.weight.dtype)
    if isinstance(parent, nn.Sequential):
        parent[int(attribute)] = new
    else:
        setattr(parent, attribute, new)
    return True


def is_torchvision_name(name: str) -> bool:
    """Whether ``name`` is a torchvision classification architecture (``resnet18``, ``efficientnet_b0`` ...)."""
    if not name.startswith(TORCHVISION_PREFIXES):
        return False
    import torchvision

    return name in torchvision.models.list_models(module=torchvision.models)


def torchvision_layers(name: str, num_classes: int) -> nn.Module:
    """A torchvision architecture with random weights (never downloaded) and its head resized."""
    if not is_torchvision_name(name):
        raise ValueError(f"unknown torchvision classification model {name!r}")
    import torchvision

    model = torchvision.models.get_model(name, weights=None)
    resize_head(model, num_classes)
    return model


def is_classifier_name(name: str) -> bool:
    """Whether ``name`` is a classifier architecture by name (``yolov5n-cls``, ``resnet18`` ...), not a file."""
    return "/" not in str(name) and not str(name).endswith(".pt") and bool(
        parse_cls_name(name) or is_torchvision_name(str(name)))


def parse_cls_name(name: str) -> str | None:
    """The size of a published classifier name (``yolov5n-cls`` → ``'n'``; also ``n-cls``), else None."""
    key = str(name).lower()
    if not key.endswith(CLS_SUFFIX):
        return None
    try:
        return parse_version(key.removesuffix(CLS_SUFFIX))
    except ValueError:
        return None


class Classifier(nn.Module):
    """An image classifier: ``model(imgs)`` → logits ``[B, num_classes]``.

    Build one with :meth:`from_name` (``yolov5n-cls`` … ``yolov5x-cls``, or a torchvision name), or
    :meth:`from_detector` (a detector's backbone and a Classify head, as the reference's ``--model
    yolov5s.pt``); ``layers`` is the network itself. ``arch`` names the architecture (``yolov5s-cls``,
    ``resnet18``) and ``cutoff`` the layer where a YOLOv5 backbone was cut (None for torchvision).
    """

    task: Task = "classify"
    dynamic_size = True
    fixed_size = None
    # The YOLOv5 backbones and the torchvision models downsample 32 times: input sides round to multiples of it.
    size_multiple = 32
    default_img_size = CLASSIFY_IMG_SIZE

    def __init__(self, layers: nn.Module, num_classes: int, arch: str, names: Sequence[str] | None = None,
                 cutoff: int | None = None, in_channels: int = 3) -> None:
        super().__init__()
        self.num_classes = _check_num_classes(num_classes)
        self.names = [str(n) for n in names] if names is not None else [str(i) for i in range(self.num_classes)]
        if len(self.names) != self.num_classes:
            raise ValueError(f"{len(self.names)} class names for {self.num_classes} classes")
        self.model = layers
        self.arch = arch
        self.cutoff = cutoff
        self.in_channels = in_channels

    @classmethod
    def from_detector(cls, detector: Yolov5, num_classes: int, names: Sequence[str] | None = None,
                      cutoff: int = DEFAULT_CUTOFF, dropout: float = 0.0) -> Classifier:
        """The reference's ``ClassificationModel(model=detector, nc=num_classes, cutoff=cutoff)``: the
        detector's first layers (its weights, shared) with a new Classify head."""
        num_classes = _check_num_classes(num_classes)
        arch = f"yolov5{detector.version}{CLS_SUFFIX}" if detector.version != "custom" else f"custom{CLS_SUFFIX}"
        return cls(yolo_layers(detector, num_classes, cutoff, dropout), num_classes, arch, names, cutoff,
                   detector.in_channels)

    @classmethod
    def from_name(cls, name: str, num_classes: int = 1000, names: Sequence[str] | None = None,
                  cutoff: int = DEFAULT_CUTOFF, *, empty: bool = False) -> Classifier:
        """``yolov5n-cls`` … ``yolov5x-cls`` (random weights, the reference's initialisation) or a torchvision
        classification model (``resnet18``, ``efficientnet_b0`` ...: random weights, head of ``num_classes``).

        ``empty=True`` when a state dict's tensors are about to be taken (:meth:`assign`): a YOLOv5 classifier
        is then built without random initialisation, its tensors on the "meta" device until assigned (a
        torchvision model is built as usual: not all of them can be built there)."""
        num_classes = _check_num_classes(num_classes)
        size = parse_cls_name(name)
        if size is not None:
            return cls(published_layers(size, num_classes, cutoff, empty=empty), num_classes,
                       f"yolov5{size}{CLS_SUFFIX}", names, cutoff)
        if is_torchvision_name(name):
            return cls(torchvision_layers(name, num_classes), num_classes, name, names)
        raise ValueError(f"unknown classification model {name!r}: choose yolov5n-cls … yolov5x-cls or a torchvision "
                         "model name (resnet18, efficientnet_b0 ...)")

    @property
    def arch_name(self) -> str:
        """The architecture's name (:attr:`arch`: ``yolov5s-cls``, ``resnet18``)."""
        return self.arch

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def precision(self) -> str:
        return PRECISIONS.get(self.dtype, str(self.dtype).removeprefix("torch."))

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        if imgs.ndim != 4 or imgs.shape[1] != self.in_channels:
            raise ValueError(f"expected images [B, {self.in_channels}, H, W], got shape {tuple(imgs.shape)}")
        return self.model(imgs)

    def assign(self, state: Mapping[str, torch.Tensor]) -> Classifier:
        """Take the tensors of ``state`` (every one of the model's, as they are: not copied, in their dtype)
        as the model's own: how a model built with ``from_name(..., empty=True)`` gets its weights."""
        self.load_state_dict(state, strict=True, assign=True)
        return self

    def resize_head(self, num_classes: int, names: Sequence[str] | None = None) -> Classifier:
        """A new output layer for ``num_classes`` classes when the count differs (fine-tuning on other data)."""
        num_classes = _check_num_classes(num_classes)
        resize_head(self.model, num_classes)
        self.num_classes = num_classes
        self.names = [str(n) for n in names] if names is not None else [str(i) for i in range(num_classes)]
        return self

    def fuse(self) -> Classifier:
        """Fold every YOLOv5 Conv's BatchNorm into its convolution (inference only); returns self in eval mode."""
        fuse_convs(self)
        return self

    def extra_repr(self) -> str:
        return f"arch={self.arch!r}, num_classes={self.num_classes}"


@singledispatch
def classifier_from(model: Yolov5 | Classifier, num_classes: int, names: Sequence[str] | None = None,
                    cutoff: int = DEFAULT_CUTOFF) -> Classifier:
    """The classifier the reference's ``classify/train.py`` trains from ``model``: a detector is cut at
    ``cutoff`` and given a Classify head; a classifier keeps its weights, its output layer resized to
    ``num_classes`` when the count differs (one implementation per model class, registered below)."""
    raise TypeError(f"expected a Yolov5 or a Classifier, got {type(model).__name__}")


@classifier_from.register
def _classifier_from_detector(model: Yolov5, num_classes: int, names: Sequence[str] | None = None,
                              cutoff: int = DEFAULT_CUTOFF) -> Classifier:
    return Classifier.from_detector(model, num_classes, names, cutoff)


@classifier_from.register
def _classifier_from_classifier(model: Classifier, num_classes: int, names: Sequence[str] | None = None,
                                cutoff: int = DEFAULT_CUTOFF) -> Classifier:
    return model.resize_head(num_classes, names if names is not None else
                             (model.names if model.num_classes == num_classes else None))
