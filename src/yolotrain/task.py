"""What a task is to the shared code: the :class:`Task` interface and the registry that finds each task.

A task (detection, segmentation, classification, and those that come next) is a package under
:mod:`yolotrain.tasks` that owns everything that differs between tasks; the engine, ``val``,
``predict``, ``track``, export and the command line ask the task for it through this interface instead
of comparing task names. The registry maps a task's name (a model's ``task`` attribute, a checkpoint's
or an export's ``task`` metadata) to its package, imported by name when first asked for, so this module
sits with the base helpers and every layer can look a task up; the packages themselves sit above
evaluation and export, whose code they use.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cache
from importlib import import_module
from typing import TYPE_CHECKING, Any

from .settings import ConfigError

if TYPE_CHECKING:
    import torch

# Task name → the package that defines it (its ``TASK`` attribute is the task's one instance). A new
# task adds its package and one line here.
TASK_PACKAGES: dict[str, str] = {
    "detect": "yolotrain.tasks.detect",
    "segment": "yolotrain.tasks.segment",
    "classify": "yolotrain.tasks.classify",
}


class Task(ABC):
    """One task's answers to the shared code. Each area of the shared code (training, evaluation,
    prediction, export) declares here the methods it asks a task for; the task packages implement them.
    """

    name: str

    # Training: the engine's data, model, criterion, configuration and results.

    # Evaluation and prediction: val, predict, inference, tracking.

    @abstractmethod
    def runs_in_torch(self, model: Any) -> bool:
        """Whether ``model`` is this task's PyTorch model, which val and predict ready for inference on a copy
        (fused, channels-last, in half precision) and whose layers ``--visualize`` looks into; false for an
        export's runtime and for a wrapper of models (test-time augmentation, an ensemble)."""

    @abstractmethod
    def augment_refusal(self, name: str) -> str | None:
        """Why ``--augment`` (the reference's test-time augmentation) is refused for this task's model
        ``name`` (a file, or "the Yolov5 given"), in one line; None where the task's models have it."""

    @abstractmethod
    def ensemble_refusal(self, name: str) -> str | None:
        """Why this task's model ``name`` cannot be a member of an ensemble (several ``--weights``, whose
        boxes are merged), in one line; None where it can."""

    @abstractmethod
    def check_inference(self, model: Any) -> None:
        """Refuse, in one line (``ValueError``), a model of this task that val and predict cannot run."""

    @abstractmethod
    def validate(self, model: Any, model_or_weights: Any, data: Any, device: torch.device, **settings: Any) -> Any:
        """``val``'s results for ``model`` (ready for inference on ``device``; loaded from ``model_or_weights``)
        on ``data``, with the keyword settings of :func:`yolotrain.eval.val.val` (``hooks``: its callbacks)."""

    @abstractmethod
    def predictor(self, predictor: Any, img_size: int | None, save_crop: bool) -> Any:
        """What predicts on each image for ``predict``, given the detection :class:`~yolotrain.eval.predict.Predictor`
        loaded with the run's settings (``img_size`` as asked, None: the model's); refuses in one line
        (``ValueError``) the options the task has no meaning for."""

    @abstractmethod
    def track_refusal(self, name: str) -> str | None:
        """Why ``track`` cannot follow this task's model ``name`` from frame to frame, in one line; None
        where it can."""

    # Export, runtimes and checkpoints.

    # Models, the command line and the YOLO object.


def task_names() -> tuple[str, ...]:
    """The registered tasks' names."""
    return tuple(TASK_PACKAGES)


@cache
def get_task(name: str) -> Task:
    """The registered task called ``name``; a name that is not one is refused in one line."""
    if name not in TASK_PACKAGES:
        raise ConfigError(f"unknown task {name!r}: expected one of {', '.join(TASK_PACKAGES)}")
    return import_module(TASK_PACKAGES[name]).TASK


def task_of(model: Any) -> Task:
    """The task of a model, a runtime or anything else that carries a ``task`` name."""
    return get_task(model.task)
