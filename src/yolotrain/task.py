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
from collections.abc import Callable, Sequence
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

    # Export, runtimes and checkpoints.

    # The output kinds an export of this task's models gives, in the graph's order (``"boxes"``,
    # ``"mask_prototypes"``, ``"logits"``: see yolotrain.interop.export_graph); a format exports them when it
    # carries every one.
    export_outputs: tuple[str, ...]

    @abstractmethod
    def export_format_refusal(self, fmt: str, supported: Sequence[str]) -> str:
        """Why this task's models do not export to ``fmt``, a format that lacks one of :attr:`export_outputs`
        (``supported``: the formats that carry them all), in one line."""

    @abstractmethod
    def check_export_options(self, half: bool, int8: bool, raw: bool, nms: bool) -> None:
        """Refuse, in a one-line ``ValueError``, the export options (``--half``, ``--int8``, ``--raw``,
        ``--nms``) this task's exports cannot have; the format's own capabilities are checked before."""

    @abstractmethod
    def export_metadata(self, model: Any) -> dict[str, str]:
        """The task's own fields of an export's string metadata (the model's name, its class count, and what
        its runtime needs to read the outputs back: anchors, mask coefficients, the task's name)."""

    @abstractmethod
    def trace_export(self, graph: Any, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The outputs ``graph`` (an :class:`~yolotrain.interop.export_graph.ExportGraph`: its ``model``, ``raw``
        and ``nms`` settings) gives for ``images`` when traced, in the order of :attr:`export_outputs` (a
        detector's raw maps: one per level)."""

    @abstractmethod
    def exported_metadata_problem(self, raw: bool, nms: bool) -> str | None:
        """Why an export's metadata saying ``raw`` outputs or ``nms`` inside cannot be one of this task's
        (None when it can)."""

    @abstractmethod
    def exported_output_mismatch(self, runtime: Any, shapes: Sequence[Sequence[int | None]],
                                 input_hw: Sequence[int | None]) -> str | None:
        """What the metadata of ``runtime`` (an :class:`~yolotrain.interop.runtime.ExportedModel`) implies about
        its outputs that ``shapes`` (None: an axis not known) contradicts, for an input of ``input_hw`` pixels;
        None when nothing does."""

    @abstractmethod
    def exported_default_img_size(self, runtime: Any) -> int:
        """The image side ``runtime`` runs at unless told otherwise."""

    @abstractmethod
    def checkpoint_architecture(self, model: Any) -> dict[str, Any]:
        """The json fields a checkpoint of ``model`` records to rebuild it."""

    @abstractmethod
    def checkpoint_num_classes(self, model: Any) -> int:
        """The class count of ``model`` (the number of class names a checkpoint or an export records)."""

    @abstractmethod
    def validate_checkpoint(self, metadata: dict[str, Any], bad: Callable[[str, str], Exception]) -> None:
        """Check the architecture fields of a checkpoint json of this task (its ``nc`` and ``names`` are
        checked already); ``bad(field, why)`` is the error to raise."""

    @abstractmethod
    def rebuild_checkpoint(self, metadata: dict[str, Any], state: dict[str, torch.Tensor], source: str) -> Any:
        """The model of a checkpoint (its validated json and the tensors to load, kept in their dtype), in eval
        mode; a one-line ``CheckpointError`` naming ``source`` when the tensors do not fit."""

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
