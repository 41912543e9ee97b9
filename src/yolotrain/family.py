"""What a model family is to the box tasks: the :class:`ModelFamily` interface and the registry that finds each.

Detection and segmentation (and the tasks that come next) are served by more than one design of head: YOLOv5's
anchor boxes, and the anchor-free head of YOLOv5u, YOLOv8 and YOLO11 (box sides as distributions, targets
assigned by task alignment). A task asks the family of its model for what the head's design decides: the
models a name builds, the loss, AutoAnchor, the recipe, a new head for other classes, and the architecture
fields of checkpoints and exports. Everything else (data, metrics, NMS, prediction, tracking, export graphs) is
the task's, shared by every family: a family's models give the same decoded outputs.

The registry maps a family's name (a model's ``family`` attribute, a checkpoint's or an export's ``family``
metadata; files without one are YOLOv5's) to its package under :mod:`yolotrain.families`, imported by name
when first asked for, as :mod:`yolotrain.task` finds tasks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from functools import cache
from importlib import import_module
from typing import TYPE_CHECKING, Any

from .settings import ConfigError

if TYPE_CHECKING:
    import torch

# Family name → the package that defines it (its ``FAMILY`` attribute is the family's one instance). The first
# is the family of models, files and names that say none.
FAMILY_PACKAGES: dict[str, str] = {
    "yolov5": "yolotrain.families.yolov5",
    "anchor_free": "yolotrain.families.anchor_free",
}
DEFAULT_FAMILY = "yolov5"


class ModelFamily(ABC):
    """One head design's answers to the box tasks (see the module's docstring)."""

    name: str
    # How validation scores its detections, by the name of the rules in yolotrain.eval.metrics.SCORING_RULES:
    # "yolov5" (YOLOv5's val.py) or "ultralytics" (Ultralytics 8.4's, with which the anchor-free models publish).
    scoring: str = "yolov5"
    # The NMS IoU thresholds used when none is given: the one the family's reference validates with (its mAP) and
    # the one it predicts with (YOLOv5's val.py and detect.py; Ultralytics uses 0.7 for both).
    val_iou: float = 0.6
    predict_iou: float = 0.45

    # Names and models.

    # The PyTorch class of this family's box models (detection and segmentation).
    model_class: type

    def owns_model(self, model: Any) -> bool:
        """Whether ``model`` is one of this family's PyTorch models."""
        return isinstance(model, self.model_class)

    @abstractmethod
    def claims_model_name(self, model: str) -> bool:
        """Whether ``model`` (a run's ``--model``: an architecture's name, its YAML or its published weights'
        file name) names one of this family's models, so that a run of it takes this family's recipe (the default
        family is asked last: it claims what no other does)."""

    @abstractmethod
    def names_model_yaml(self, stem: str, task: str) -> bool:
        """Whether ``stem`` (of ``STEM.yaml``) names one of this family's published architectures for ``task``."""

    # Training.

    @abstractmethod
    def training_recipe(self, data: str | None) -> Mapping[str, Any]:
        """Settings (dotted paths) that replace the shared defaults when not given, on the dataset ``data``
        (``None``: the built-in shapes)."""

    @abstractmethod
    def search_limits(self) -> Mapping[str, tuple[float, float]]:
        """``(low, high)`` of the hyper-parameters whose scale for this family's loss differs from YOLOv5's
        evolution limits: the ranges ``tune``'s default space searches and evolution keeps them in."""

    @abstractmethod
    def from_scratch_hint(self, model: str) -> str:
        """How to start the architecture ``model`` names from published weights."""

    @abstractmethod
    def fit_anchors(self, trainer: Any, model: Any) -> None:
        """AutoAnchor before a fresh run (nothing for a family without anchors)."""

    @abstractmethod
    def training_loss(self, task: str, config: Any) -> Callable[..., Callable]:
        """The loss class (or factory) of ``task``'s models of this family, called as
        ``loss(model, rect_training=, img_size=, hyp=)``."""

    @abstractmethod
    def with_new_head(self, model: Any, num_classes: int) -> Any:
        """``model`` for ``num_classes`` classes: the same layers, the head's class outputs fresh."""

    # Checkpoints and exports.

    @abstractmethod
    def raw_export_refusal(self) -> str | None:
        """Why ``--raw`` (the head's maps, decoded by the runtime) cannot export this family's models, in one line;
        None where it can."""

    @abstractmethod
    def export_metadata(self, model: Any) -> dict[str, str]:
        """The family's fields of an export's string metadata (the model's name, class count, strides and what
        decoding the raw maps needs)."""

    @abstractmethod
    def checkpoint_architecture(self, model: Any) -> dict[str, Any]:
        """The json fields a checkpoint of ``model`` records to rebuild it."""

    @abstractmethod
    def validate_checkpoint(self, metadata: dict[str, Any], bad: Callable[[str, str], Exception]) -> None:
        """Check the architecture fields of a checkpoint json of this family; ``bad(field, why)`` is the error."""

    @abstractmethod
    def rebuild_checkpoint(self, metadata: dict[str, Any], state: dict[str, torch.Tensor], source: str) -> Any:
        """The model of a checkpoint (its validated json and tensors, kept in their dtype), in eval mode."""


def nms_iou(iou: float | None, model: Any, stage: str) -> float:
    """``iou`` when given, else the threshold ``model``'s family uses at ``stage`` (``"val"`` or ``"predict"``):
    see :func:`family_of`."""
    if iou is not None:
        return iou
    family = family_of(model)
    return family.val_iou if stage == "val" else family.predict_iou


def family_names() -> tuple[str, ...]:
    """The registered families' names."""
    return tuple(FAMILY_PACKAGES)


@cache
def get_family(name: str) -> ModelFamily:
    """The registered family called ``name``; a name that is not one is refused in one line."""
    if name not in FAMILY_PACKAGES:
        raise ConfigError(f"unknown model family {name!r}: expected one of {', '.join(FAMILY_PACKAGES)}")
    return import_module(FAMILY_PACKAGES[name]).FAMILY


def family_of(model: Any) -> ModelFamily:
    """The family of a checkpoint's metadata or a runtime (by their ``family`` key or attribute) or of a PyTorch model
    (the family that owns it); YOLOv5's when they name none. A composite model (test-time augmentation, ensemble,
    slicing: a ``first`` member) is its first member's family."""
    while hasattr(model, "first"):
        model = model.first
    if isinstance(model, Mapping):
        return get_family(model.get("family", DEFAULT_FAMILY))
    if hasattr(model, "family"):
        return get_family(model.family)
    return next((get_family(name) for name in FAMILY_PACKAGES if get_family(name).owns_model(model)),
                get_family(DEFAULT_FAMILY))


def family_of_name(model: str) -> ModelFamily:
    """The family whose model ``model`` (a run's ``--model``) names; YOLOv5's when no other claims it."""
    return next((get_family(name) for name in FAMILY_PACKAGES
                 if name != DEFAULT_FAMILY and get_family(name).claims_model_name(model)), get_family(DEFAULT_FAMILY))
