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
from typing import Any

from .settings import ConfigError

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

    # Export, runtimes and checkpoints.

    # Models, the command line and the YOLO object.

    @abstractmethod
    def is_pytorch_model(self, model: Any) -> bool:
        """Whether ``model`` is one of this task's PyTorch models (not an export's runtime or another
        library's object): what ``info`` describes (by its ``arch_name``) and the YOLO object moves to the best
        device."""

    @abstractmethod
    def names_model_yaml(self, stem: str) -> bool:
        """Whether ``stem`` (of ``STEM.yaml``) names one of this task's published architectures, which the YOLO
        object builds by that name when no such file exists (as the reference finds its own model YAMLs)."""


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
