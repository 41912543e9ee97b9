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
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib import import_module
from pathlib import Path
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
    "obb": "yolotrain.tasks.obb",
    "pose": "yolotrain.tasks.pose",
}


class Task(ABC):
    """One task's answers to the shared code. Each area of the shared code (training, evaluation,
    prediction, export) declares here the methods it asks a task for; the task packages implement them.
    """

    name: str

    # Training: the engine's data, model, criterion, configuration and results.

    def claims_model_name(self, model: str) -> bool:
        """Whether ``model`` (a run's ``--model``) names one of this task's own models, so that a run of it
        takes this task's recipe (the trainer asks the tasks in registry order)."""
        return False

    def claims_dataset(self, path: str) -> bool:
        """Whether the dataset at ``path`` has this task's own layout, so that a run on it takes this task's
        recipe (asked in registry order, after the model names)."""
        return False

    @abstractmethod
    def training_defaults(self, data: str | None) -> Mapping[str, Any]:
        """The run settings (dotted paths such as ``data.img_size``) that fill those left unset, on the dataset
        ``data`` (``None``: the built-in shapes dataset)."""

    def training_recipe(self, model: str, data: str | None) -> Mapping[str, Any]:
        """Settings (dotted paths) that replace the shared defaults when not given: the task's own recipe for the
        run's ``model`` (its ``--model``) on the dataset ``data`` (``None``: the built-in shapes)."""
        return {}

    @abstractmethod
    def from_scratch_hint(self, config: Any) -> str:
        """How to start the run's architecture (``config``: a ``TrainConfig``) from published weights."""

    @abstractmethod
    def build_training_data(self, trainer: Any, autobatch: Callable[[], Any]) -> None:
        """Fill ``trainer``'s class names, model, loaders, datasets, batch sampler, data root and dataset
        record from its configuration; ``autobatch()`` replaces the configuration's batch by the one that
        fits the GPU (once the model is built) and returns the new configuration."""

    @abstractmethod
    def fit_anchors(self, trainer: Any, model: Any) -> None:
        """AutoAnchor before a fresh run: check (and refit) an anchor head's anchors on the training labels;
        nothing for a model without anchors."""

    @abstractmethod
    def training_criteria(self, model: Any, ema_model: Any | None, config: Any,
                          custom: Callable[[Any, bool], Callable] | None) -> tuple[Callable, Callable | None]:
        """The training criterion of ``model`` (``custom(model, rect_training)`` when given, else the task's
        loss with the run's settings) and, with ``ema_model`` (the process that validates), the validation one."""

    def training_targets(self, batch: Any, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The criterion's targets, on ``device``, from a loader ``batch`` (a
        :class:`~yolotrain.data.batch.Batch`, or the subclass of it the task's dataset collates, whose own
        fields the task reads by name)."""
        return (batch.targets.to(device, non_blocking=True),)

    @abstractmethod
    def model_label(self, model: Any) -> str:
        """The model's name in the training log (``yolov5s``, ``yolov5s-cls``)."""

    @abstractmethod
    def save_training_labels(self, path: Path, labels: Any, names: Sequence[str]) -> Path:
        """``path`` (labels.jpg): the training labels' statistics (``labels``: the training set's)."""

    def save_training_batch(self, path: Path, batch: Any, names: Sequence[str], config: Any) -> bool:
        """Draw a training ``batch`` as the model saw it (its ``imgs`` those of the training step) with its
        labels to ``path``; False when the task draws none."""
        return False

    @property
    @abstractmethod
    def result_columns(self) -> tuple[str, ...]:
        """The validation metrics' columns of results.csv (left empty in epochs that skip validation); the validation
        loss's parts follow them, one ``val_<part>`` column per part the criterion names."""

    @abstractmethod
    def result_values(self, result: Any) -> dict[str, float]:
        """The results.csv values of a validation ``result`` (what ``val`` returns for this task's models)."""

    @abstractmethod
    def result_summary(self, result: Any) -> str:
        """The validation line printed after each epoch but the last (which prints the full table)."""

    @property
    @abstractmethod
    def logger_tags(self) -> Mapping[str, str]:
        """results.csv column → the reference's TensorBoard tag, for this task's loss parts and metrics."""

    # Evaluation and prediction: val, predict, inference, tracking.

    @abstractmethod
    def augment_refusal(self, name: str) -> str | None:
        """Why ``--augment`` (the reference's test-time augmentation) is refused for this task's model
        ``name`` (a file, or "the Yolov5 given"), in one line; None where the task's models have it."""

    @abstractmethod
    def slicing_refusal(self, name: str) -> str | None:
        """Why ``--slice`` (predicting on overlapping tiles whose boxes NMS merges) is refused for this task's
        model ``name``, in one line; None where the task's models have it."""

    def tile_grid(self, model: Any) -> int:
        """The grid, in px of the input, on which ``--slice``'s tiles start for this task's ``model`` (see
        :func:`yolotrain.eval.slicing.tile_origins`): 1, anywhere, for outputs moved from the tiles to the image
        by any offset (boxes); a task whose outputs hold maps that are stitched pixel for pixel needs a multiple
        of the maps' stride."""
        return 1

    def join_tile_outputs(self, outputs: Sequence[Any], tiles: Any) -> Any:
        """The outputs this task's model gives for a batch of whole images, made of ``outputs``: the model's
        outputs for chunks of the batch's ``--slice`` tiles, in order. ``tiles`` (a
        :class:`~yolotrain.eval.slicing.TiledBatch`: the tiles and the batch's size) joins each kind:
        ``tiles.predictions`` the decoded predictions (boxes moved to the image, gathered per image for the one
        NMS), ``tiles.maps`` image-aligned maps (stitched into one per image). By default the outputs are the
        decoded predictions alone. Asked only of a task whose :meth:`slicing_refusal` is None."""
        return tiles.predictions(outputs)

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
        """What predicts on each image for ``predict``, given the detection :class:`~yolotrain.prediction.run.Predictor`
        loaded with the run's settings (``img_size`` as asked, None: the model's); refuses in one line
        (``ValueError``) the options the task has no meaning for."""

    @abstractmethod
    def track_refusal(self, name: str) -> str | None:
        """Why ``track`` cannot follow this task's model ``name`` from frame to frame, in one line; None
        where it can."""

    # Export, runtimes and checkpoints.

    # The output kinds an export of this task's models gives, in the graph's order (``"boxes"``,
    # ``"mask_prototypes"``, ``"logits"``: see yolotrain.interop.exporting.graph); a format exports them when it
    # carries every one.
    export_outputs: tuple[str, ...]
    # The formats (by name) whose exports of this task's models were checked to give PyTorch's outputs, where
    # not every format that carries the output kinds does; None: each of those formats.
    export_formats: frozenset[str] | None = None

    @abstractmethod
    def export_format_refusal(self, fmt: str, supported: Sequence[str]) -> str:
        """Why this task's models do not export to ``fmt``, a format that lacks one of :attr:`export_outputs` or is
        not among :attr:`export_formats` (``supported``: the formats it exports to), in one line."""

    @abstractmethod
    def check_export_options(self, half: bool, int8: bool, raw: bool, nms: bool) -> None:
        """Refuse, in a one-line ``ValueError``, the export options (``--half``, ``--int8``, ``--raw``,
        ``--nms``) this task's exports cannot have; the format's own capabilities are checked before."""

    @abstractmethod
    def export_metadata(self, model: Any) -> dict[str, str]:
        """The task's own fields of an export's string metadata (the model's name, its class count, and what
        its runtime needs to read the outputs back: output strides and anchors, mask coefficients, the task's name)."""

    @abstractmethod
    def trace_export(self, graph: Any, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The outputs ``graph`` (an :class:`~yolotrain.interop.exporting.graph.ExportGraph`: its ``model``, ``raw``
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

    @abstractmethod
    def is_pytorch_model(self, model: Any) -> bool:
        """Whether ``model`` is one of this task's PyTorch models (not an export's runtime, a wrapper of
        models such as test-time augmentation or an ensemble, or another library's object): what val and
        predict ready for inference on a copy (fused, channels-last, in half precision), whose layers
        ``--visualize`` looks into, what ``info`` describes (by its ``arch_name``) and what the YOLO object
        moves to the best device."""

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
