"""The configuration of a training run: one frozen tree of typed settings, resolved once.

``TrainConfig`` holds the run-level settings and one section per stage, each defined next to the
code that reads it::

    TrainConfig                      model, epochs, device, seed, project, name ...
    ├── data:    DataConfig          data/loaders.py   dataset, image size, batch, workers, cache
    ├── augment: AugmentConfig       data/augment.py   HSV, affine, flips, mosaic, mixup
    ├── loss:    LossConfig          loss/detect.py    box/obj/cls gains, anchor threshold
    ├── optim:   OptimConfig         engine/optim.py   optimiser, lr schedule, warm-up, accumulation
    ├── ema:     EMAConfig           engine/ema.py     decay and its ramp
    ├── eval:    EvalConfig          eval/val.py       per-epoch validation, NMS settings, plots
    └── classify: ClassifyConfig     model/classify.py the Classify head's cut and dropout (classifiers)

:func:`resolve_config` turns what the user gave (a saved ``config.yaml``, a flat hyper-parameter
YAML, command-line options, keyword arguments) into a complete, validated tree, filling the settings
left at ``None`` from the data: the built-in shapes dataset gets a small-image, CPU-friendly recipe,
real datasets the reference's. Checkpoints store the resolved tree, so a resumed run continues with
exactly the values it started with.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..data.augment import AugmentConfig
from ..data.loaders import DataConfig, default_workers
from ..eval.val import EvalConfig
from ..interop.loading.anchor_free import is_anchor_free_name
from ..interop.loading.resolve import is_published_name, names_architecture
from ..loss import LossConfig
from ..model import parse_version
from ..model.classify import ClassifyConfig
from ..runs import run_dir
from ..settings import ConfigError, flat_names, from_mapping, merge, nest, setting, to_dict, validate
from ..task import get_task, task_names
from ..yamlio import YamlError, read_yaml
from .ema import EMAConfig
from .optim import AUTO, DEFAULT_LR0, OptimConfig


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Build it with :func:`resolve_config`; sizes left at ``None`` follow the data."""

    model: str = setting("yolov5n", "yolov5n|s|m|l|x or n6..x6 (from scratch), a model YAML, or weights to "
                         "fine-tune (yolov5n.pt: the official COCO weights, downloaded once)")
    pretrained: str | None = setting(None, "weights whose tensors of the same name and shape start --model's "
                                     "architecture (on the command line: --model yolov5n-seg.yaml --weights "
                                     "yolov5n.pt, a segmentation model from detection weights)")
    epochs: int | None = setting(None, "epochs (100; 30 on shapes)", min=1)
    device: str | None = setting(None, "cpu, cuda, cuda:N, GPUs 0,1 (a process each) or mps (a GPU when present)")
    seed: int = setting(0, "seed of the weights, the shuffling and the augmentations", min=0)
    sync_bn: bool = setting(False, "SyncBatchNorm across processes (CUDA)")
    doctor: bool = setting(False, "run the first step under the in-place doctor")
    project: str = setting("runs/train", "parent of the run folder")
    name: str = setting("exp", "run folder name (exp, exp2 ... when taken)")
    exist_ok: bool = setting(False, "reuse an existing run folder")
    patience: int = setting(100, "stop after this many epochs without a fitness gain (0: never stop early)", min=0)
    save_period: int = setting(-1, "also keep weights/epochN every N epochs (N = 0-based epoch; -1: off)", min=-1)
    freeze: tuple[int, ...] = setting((0,), "freeze layers: one N = the first N (backbone = 10), several = "
                                      "those layer indices", min=0)
    tensorboard: bool = setting(True, "TensorBoard event files in the run folder (when tensorboard is installed)")
    loggers: tuple[Literal["mlflow", "wandb", "comet", "clearml", "neptune", "dvc"], ...] = setting(
        (), "also log to these experiment trackers: mlflow, wandb, comet, clearml, neptune, dvc (each needs its "
        "package: pip install 'yolotrain[mlflow]'); without a server configured Comet, ClearML and Neptune log "
        "offline into the run folder, DVC always does; MLflow uses $MLFLOW_TRACKING_URI, else a store there",
        flags=("--logger",))
    entity: str | None = setting(None, "W&B team or user of --logger wandb runs (default: your own)")
    bbox_interval: int = setting(
        -1, "--logger wandb: the first 16 validation images with their predicted boxes every N epochs (-1: every "
        "epochs/10 epochs, each epoch in runs of 10 or fewer, none under --noplots; 0: never)",
        flags=("--bbox-interval", "--bbox_interval"), min=-1)
    autoanchor: bool = setting(True, "check the anchors against the training labels before training; refit "
                               "them when the best possible recall is below 0.98", off_flags=("--noautoanchor",))
    amp: Literal["auto", "off", "bf16", "fp16"] = setting(
        "auto", "mixed precision: auto = fp16 on CUDA (as the reference), bf16 on CPUs with native bfloat16 "
        "(AVX512-BF16 or AMX), else off (float32); the run's first line says which")
    channels_last: bool = setting(True, "channels-last (NHWC) memory layout for the model and batches, the "
                                  "layout oneDNN and cuDNN convolutions run fastest in")
    compile: bool = setting(False, "torch.compile the training forward and backward: faster steps after a "
                            "compilation of minutes (pays off on long runs; the first step reports its time)")
    data: DataConfig = field(default_factory=DataConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    classify: ClassifyConfig = field(default_factory=ClassifyConfig)

    @property
    def task(self) -> str:
        """The recipe this run takes: that of the first registered task that claims the model's name or the
        dataset's layout (``classify`` for a classifier name or a folder of class folders: a detector given one
        is cut into a classifier, as the reference's ``classify/train.py`` cuts ``--model yolov5s.pt``), else
        ``detect`` (detection and segmentation share one recipe; the trainer follows the model there)."""
        data = self.data.path
        for name in task_names():
            task = get_task(name)
            if task.claims_model_name(self.model) or (data is not None and task.claims_dataset(data)):
                return name
        return DEFAULT_TASK

    def to_dict(self) -> dict[str, Any]:
        """The nested plain-value form saved in checkpoints and ``config.yaml``."""
        return to_dict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Rebuild (and validate) a configuration from its :meth:`to_dict` form."""
        return from_mapping(cls, values)


# The recipe of a run whose model and data no task claims (detection's, which also trains segmentation models).
DEFAULT_TASK = "detect"

# Sections a hyper-parameter file may set (the reference's hyp.*.yaml keys live here).
HYP_SECTIONS = ("augment", "loss", "optim", "ema")

# The defaults of the settings left unset are the task's (Task.training_defaults: detection's for the built-in
# shapes and for real datasets, classification's reference recipe).
# P6 architectures on real datasets (on shapes: the shapes size rounded up to their stride, 64).
P6_IMG_SIZE = 1280


# Keys of the reference's hyper-parameter files that yolotrain accepts but does not use, and why.
IGNORED_HYP_KEYS = {
    "iou_t": "the reference does not use it either (its target assignment has no IoU threshold)",
    "anchors": "new anchor counts are not supported; the 3 anchors per level are fitted by AutoAnchor",
}


class IgnoredSettingWarning(UserWarning):
    """A setting of a reference hyper-parameter file that yolotrain accepts but does not use."""


def read_settings_file(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The mapping in a YAML file of settings; one-line errors for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        values = read_yaml(path)
    except YamlError as error:
        raise ConfigError(str(error)) from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(values).__name__}")
    return values


def hyp_settings(hyp: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """Flat hyper-parameters (``lr0: 0.01``, ``mosaic: 1.0`` ...) from a YAML file or a mapping, nested.

    Only augmentation, loss, optimiser and EMA settings belong in a hyper-parameter file. Keys of the
    reference's files that are not used here (:data:`IGNORED_HYP_KEYS`) get one warning each.
    """
    where = f"{hyp}: " if isinstance(hyp, (str, os.PathLike)) else "hyp: "
    flat = read_settings_file(hyp, "hyper-parameter file") if isinstance(hyp, (str, os.PathLike)) else dict(hyp)
    for key in [k for k in flat if k in IGNORED_HYP_KEYS]:
        warnings.warn(f"{where}{key!r} ({flat.pop(key)!r}) is ignored: {IGNORED_HYP_KEYS[key]}",
                      IgnoredSettingWarning, stacklevel=2)
    names = flat_names(TrainConfig)
    allowed = {name for name, path in names.items() if path.split(".")[0] in HYP_SECTIONS}
    for key in flat:
        if key in names and key not in allowed:
            raise ConfigError(f"{where}{key!r} is a run setting, not a hyper-parameter; set it as an option "
                              f"(--{names[key].rpartition('.')[2].replace('_', '-')})")
    try:
        return nest(TrainConfig, flat)
    except ConfigError as error:
        raise ConfigError(f"{where}{error}") from None


def resolve_config(config: TrainConfig | Mapping[str, Any] | str | os.PathLike | None = None, *,
                   hyp: str | os.PathLike | Mapping[str, Any] | None = None, **settings: Any) -> TrainConfig:
    """The complete, validated configuration of a run.

    Layers, later winning: the defaults; ``config`` (a :class:`TrainConfig`, its nested mapping or a
    ``config.yaml`` of a run); ``hyp`` (flat hyper-parameters, a YAML file or a mapping); ``settings``
    (flat keywords such as ``data="data.yaml"``, ``epochs=50``, ``lr0=0.02``, ``mosaic=0.0``, or whole
    sections such as ``optim={"lr0": 0.02}``). Settings still ``None`` are then filled from the data
    (the task's defaults, :meth:`yolotrain.task.Task.training_defaults`), the workers from the machine.

    Raises:
        ConfigError: an unknown setting (with the closest valid name), a wrong type or an out-of-range
            value, naming the setting.
        ValueError: ``name`` is no folder name inside ``project`` (:func:`yolotrain.runs.run_dir`).
    """
    if isinstance(config, TrainConfig):
        base = config.to_dict()
    elif isinstance(config, (str, os.PathLike)):
        base = read_settings_file(config, "configuration file")
        where = f"{config}: "
        try:
            from_mapping(TrainConfig, base)
        except ConfigError as error:
            raise ConfigError(f"{where}{error}") from None
    else:
        base = dict(config or {})
    layered = merge(base, hyp_settings(hyp)) if hyp is not None else base
    layered = merge(layered, nest(TrainConfig, settings))
    explicit_optimizer = _get(layered, "optim.optimizer") is not None
    resolved = from_mapping(TrainConfig, layered)
    task_recipe = get_task(resolved.task).training_recipe(resolved.model, resolved.data.path)
    recipe = {path: value for path, value in task_recipe.items() if _get(layered, path) is None}
    if recipe:
        resolved = from_mapping(TrainConfig, merge(resolved.to_dict(), nest(TrainConfig, {
            path.rpartition(".")[2]: value for path, value in recipe.items()})))
    filled = _fill_from_data(resolved, explicit_optimizer)
    run_dir(filled.project, filled.name)  # a --project/--name no run folder can have: refused before data is read
    return filled


def _get(tree: Mapping[str, Any], path: str) -> Any:
    for key in path.split("."):
        if not isinstance(tree, Mapping) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _is_p6(model: str) -> bool:
    """Whether ``model`` names a P6 architecture (yolov5n6 ..., the anchor-free yolov5n6u, yolov8n-p6 ...);
    checkpoints and YAMLs say so only once built."""
    if is_anchor_free_name(model):
        return Path(model).stem.lower().endswith(("6u", "-p6"))
    try:
        return parse_version(model).endswith("6")
    except ValueError:
        return False


def _fill_from_data(config: TrainConfig, explicit_optimizer: bool) -> TrainConfig:
    defaults = dict(get_task(config.task).training_defaults(config.data.path))
    if explicit_optimizer:
        defaults.pop("optim.lr0", None)  # a learning rate tuned for the default optimiser does not carry over
    tree = config.to_dict()
    if tree["data"]["img_size"] is None and _is_p6(config.model):
        # P6 models need multiples of 64 and were published at 1280 px.
        tree["data"]["img_size"] = P6_IMG_SIZE if config.data.path is not None else \
            -(-defaults["data.img_size"] // 64) * 64
    for path, value in defaults.items():
        *parents, leaf = path.split(".")
        node = tree
        for parent in parents:
            node = node[parent]
        if node[leaf] is None:
            node[leaf] = value
    if tree["optim"]["nominal_batch"] is None:  # a recipe without one (classification's) accumulates no batches
        tree["optim"]["nominal_batch"] = tree["data"]["batch_size"]
    if tree["optim"]["lr0"] is None and tree["optim"]["optimizer"] != AUTO:  # auto: fitted by the trainer
        tree["optim"]["lr0"] = DEFAULT_LR0[tree["optim"]["optimizer"]]
    if tree["data"]["workers"] is None:
        tree["data"]["workers"] = default_workers()
    filled = TrainConfig.from_dict(tree)
    validate(filled)
    return filled


def with_runtime(config: TrainConfig, device: str | None = None, workers: int | None = None) -> TrainConfig:
    """The same run on another machine: only the device and the loader processes may change."""
    data = dataclasses.replace(config.data, workers=config.data.workers if workers is None else workers)
    changed = dataclasses.replace(config, device=config.device if device is None else device, data=data)
    validate(changed)
    return changed


# The command line's ``--weights`` (train and tune): the reference's spelling, alone or with an architecture.
WEIGHTS_HELP = ("weights to fine-tune (the reference's --weights yolov5s.pt); after an architecture (--model or --cfg "
                "yolov5n-seg.yaml), the weights whose tensors of the same name and shape start it")


def add_weights_option(parser: argparse.ArgumentParser) -> None:
    """``--weights FILE``, read by :func:`model_settings` with ``--model`` and ``--cfg``."""
    parser.add_argument("--weights", default=argparse.SUPPRESS, metavar="FILE", help=WEIGHTS_HELP)


def model_settings(settings: Mapping[str, Any], cfg: str | None = None) -> dict[str, Any]:
    """``settings`` of parsed ``train`` or ``tune`` options with what the run starts from as ``model`` and
    ``pretrained``: an architecture (``--model`` or the reference's ``--cfg``: a model YAML or a published name)
    started from weights (``--weights``, ``--pretrained``, or ``--model`` naming weights), or either alone.
    ``--weights`` alone is the weights to fine-tune, as in the reference; an empty value is none (the
    reference's ``--weights ''``).

    Raises:
        ConfigError: two architectures, or two weights files, named in one line.
    """
    settings = dict(settings)
    given = [("--cfg", cfg), *((f"--{key}", settings.pop(key, None)) for key in ("model", "weights", "pretrained"))]
    architectures: list[tuple[str, str, str]] = []  # (flag, as given, the architecture)
    weights: list[tuple[str, str]] = []
    for flag, spec in given:
        if not spec:
            continue
        architecture = published_architecture(spec)
        if flag == "--cfg" or (flag != "--pretrained" and names_architecture(architecture)):
            architectures.append((flag, spec, architecture))
        else:
            weights.append((flag, spec))
    if len(architectures) > 1:
        (flag, spec, _), (other_flag, other, _) = architectures[:2]
        raise ConfigError(f"{flag} {spec} and {other_flag} {other} both name an architecture: give one, and the "
                          "weights that start it with --weights")
    if len(weights) > 1:
        (flag, spec), (other_flag, other) = weights[:2]
        raise ConfigError(f"{flag} {spec} and {other_flag} {other} are both weights: a run starts from one file "
                          "(--model ARCHITECTURE --weights FILE starts an architecture from weights)")
    if architectures:
        settings["model"] = architectures[0][2]
    if weights:
        flag, spec = weights[0]
        settings["pretrained" if architectures or flag == "--pretrained" else "model"] = spec
    return settings


def published_architecture(spec: str) -> str:
    """The YAML file when it exists; ``yolov5s-seg.yaml`` (or ``models/yolov5s-seg.yaml``, as the reference finds it
    in its own folder) that is no file is the published architecture ``yolov5s-seg``."""
    path = Path(spec)
    if path.exists() or path.suffix not in (".yaml", ".yml"):
        return spec
    if not is_published_name(path.stem):
        return spec  # not a published name: the missing file is reported when the model is built
    return path.stem
