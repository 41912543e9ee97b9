"""What hyper-parameter search explores: the reference's evolution table and the search space of ``tune``.

Both are built on the typed settings: a searched name must be a setting of the hyper-parameter sections
(augment, loss, optim, ema), its kind (number, integer, choice) is the setting's type, and every range
must lie within the setting's declared bounds. :data:`REFERENCE_META` is the reference ``train.py``'s
``meta`` table (mutation gain, lower and upper limit) for the keys of its hyper-parameter files.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..engine.config import HYP_SECTIONS, TrainConfig, read_settings_file
from ..family import family_of_name
from ..messages import brief
from ..settings import ConfigError, base_type, check_value, leaves, unknown_name_error


@dataclass(frozen=True)
class Gene:
    """One row of the reference's evolution table: how strongly a value mutates, and its limits."""

    gain: float
    low: float
    high: float


# The reference's keys in the order of its hyp.scratch-*.yaml files (the columns of evolve.csv after the
# seven results), with its gains and limits. ``iou_t`` and ``copy_paste`` are kept, never mutated, so the
# files stay loadable by the reference's train.py; yolotrain does not use them (see IGNORED_HYP_KEYS).
REFERENCE_META: dict[str, Gene] = {
    "lr0": Gene(1, 1e-5, 1e-1),
    "lrf": Gene(1, 0.01, 1.0),
    "momentum": Gene(0.3, 0.6, 0.98),
    "weight_decay": Gene(1, 0.0, 0.001),
    "warmup_epochs": Gene(1, 0.0, 5.0),
    "warmup_momentum": Gene(1, 0.0, 0.95),
    "warmup_bias_lr": Gene(1, 0.0, 0.2),
    "box": Gene(1, 0.02, 0.2),
    "cls": Gene(1, 0.2, 4.0),
    "cls_pw": Gene(1, 0.5, 2.0),
    "obj": Gene(1, 0.2, 4.0),
    "obj_pw": Gene(1, 0.5, 2.0),
    "iou_t": Gene(0, 0.1, 0.7),
    "anchor_t": Gene(1, 2.0, 8.0),
    "fl_gamma": Gene(0, 0.0, 2.0),
    "hsv_h": Gene(1, 0.0, 0.1),
    "hsv_s": Gene(1, 0.0, 0.9),
    "hsv_v": Gene(1, 0.0, 0.9),
    "degrees": Gene(1, 0.0, 45.0),
    "translate": Gene(1, 0.0, 0.9),
    "scale": Gene(1, 0.0, 0.9),
    "shear": Gene(1, 0.0, 10.0),
    "perspective": Gene(0, 0.0, 0.001),
    "flipud": Gene(1, 0.0, 1.0),
    "fliplr": Gene(0, 0.0, 1.0),
    "mosaic": Gene(1, 0.0, 1.0),
    "mixup": Gene(1, 0.0, 1.0),
    "copy_paste": Gene(1, 0.0, 1.0),
}
# Reference keys without a setting here, with the value written for the reference's train.py.
UNUSED_REFERENCE_KEYS = {"iou_t": 0.2, "copy_paste": 0.0}
# Searched on a log scale by default: the learning rate spans orders of magnitude.
LOG_SCALE = frozenset({"lr0"})


@dataclass(frozen=True)
class Parameter:
    """One searched setting: a range of numbers (``int`` or ``float``, optionally log-scaled) or choices."""

    name: str
    kind: Literal["float", "int", "choice"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def contains(self, value: Any) -> bool:
        if self.kind == "choice":
            return value in self.choices
        return isinstance(value, (int, float)) and self.low <= value <= self.high


def hyp_fields() -> dict[str, tuple[str, dataclasses.Field, Any]]:
    """Flat name → (dotted path, field, type) of every setting of the hyper-parameter sections."""
    return {f.name: (path, f, tp) for path, f, tp in leaves(TrainConfig) if path.split(".")[0] in HYP_SECTIONS}


def evolution_limits(model: str | None = None) -> dict[str, tuple[float, float]]:
    """``(low, high)`` of each key of the evolution table: the reference's limits, or those of the family of the
    model ``model`` names where its loss is scaled otherwise (the anchor-free gains)."""
    limits = {name: (gene.low, gene.high) for name, gene in REFERENCE_META.items()}
    if model is not None:
        limits.update((name, bounds) for name, bounds in family_of_name(model).search_limits().items()
                      if name in limits)
    return limits


def default_space(model: str | None = None) -> tuple[Parameter, ...]:
    """The reference's mutated keys (gain > 0) that are settings here, over the reference's limits; for the model
    ``model`` names, over its family's limits where they differ, with the gains only its loss has (DFL's)."""
    fields = hyp_fields()
    limits = {name: (gene.low, gene.high) for name, gene in REFERENCE_META.items() if gene.gain > 0 and name in fields}
    if model is not None:
        limits.update(family_of_name(model).search_limits())
    return tuple(Parameter(name, "float", low, high, log=name in LOG_SCALE and low > 0)
                 for name, (low, high) in limits.items())


def read_space(source: str | os.PathLike | Mapping[str, Any]) -> tuple[Parameter, ...]:
    """The search space of a YAML file or mapping; one-line :class:`ConfigError` for anything malformed.

    Each key is a hyper-parameter setting; its value narrows it: ``[low, high]`` (a number range, or for
    a choice setting the choices), ``{low: , high: , log: }`` (missing limits are the setting's declared
    bounds), ``{choices: [...]}``, or ``{}`` for the setting's whole declared range or choices.
    """
    where = f"{source}: " if isinstance(source, (str, os.PathLike)) else "space: "
    values = read_settings_file(source, "search space file") if isinstance(source, (str, os.PathLike)) \
        else source
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}expected a mapping of settings to search, got {brief(values)}")
    if not values:
        raise ConfigError(f"{where}the search space is empty: name the settings to search, e.g. "
                          f"'lr0: [0.001, 0.02]'")
    fields = hyp_fields()
    return tuple(_parameter(str(name), spec, fields, where) for name, spec in values.items())


def _parameter(name: str, spec: Any, fields: Mapping[str, tuple[str, dataclasses.Field, Any]],
               where: str) -> Parameter:
    if name not in fields:
        if any(f.name == name for _, f, _ in leaves(TrainConfig)):
            raise ConfigError(f"{where}{name!r} is a run setting, not a hyper-parameter; only settings of the "
                              f"{', '.join(HYP_SECTIONS)} sections are searched")
        raise unknown_name_error(name, sorted(fields), where)
    path, f, tp = fields[name]
    base = base_type(tp)
    declared: tuple[Any, ...] = (True, False) if base is bool else \
        typing.get_args(base) if typing.get_origin(base) is Literal else ()
    if isinstance(spec, list):
        spec = {"choices": spec} if declared else _range(spec, name, where)
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}{name}: expected [low, high], a mapping (low, high, log, choices) or {{}}, "
                          f"got {brief(spec)}")
    unknown = set(spec) - {"low", "high", "log", "choices"}
    if unknown:
        raise unknown_name_error(str(sorted(unknown)[0]), ["low", "high", "log", "choices"], f"{where}{name}: ")
    if "choices" in spec or declared:
        choices = spec.get("choices", declared)
        if not isinstance(choices, list | tuple) or not choices:
            raise ConfigError(f"{where}{name}: choices must be a non-empty list, got {brief(choices)}")
        checked = tuple(_checked(path, f, tp, value, where) for value in choices)
        return Parameter(name, "choice", choices=tuple(dict.fromkeys(checked)))
    if base not in (int, float):
        raise ConfigError(f"{where}{name}: a {base.__name__} setting is searched over a list of choices")
    low = spec.get("low", _declared_bound(f, "low"))
    high = spec.get("high", _declared_bound(f, "high"))
    if low is None or high is None:
        missing = "low" if low is None else "high"
        raise ConfigError(f"{where}{name}: the setting declares no {'lower' if missing == 'low' else 'upper'} "
                          f"bound; give {missing}")
    low, high = (_checked(path, f, tp, value, where) for value in (low, high))
    log = spec.get("log", name in LOG_SCALE)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}{name}: log must be true or false, got {brief(log)}")
    if low > high:
        raise ConfigError(f"{where}{name}: low {low:g} is above high {high:g}")
    if log and low <= 0:
        raise ConfigError(f"{where}{name}: a log-scaled range needs low > 0, got {low:g}")
    return Parameter(name, "int" if base is int else "float", low, high, log=log)


def _range(spec: list, name: str, where: str) -> dict[str, Any]:
    if len(spec) != 2:
        raise ConfigError(f"{where}{name}: a range is [low, high], got {brief(spec)}")
    return {"low": spec[0], "high": spec[1]}


def _declared_bound(f: dataclasses.Field, side: str) -> float | None:
    if side == "low":
        return f.metadata.get("min")  # an exclusive bound ('above') cannot itself be searched
    return f.metadata.get("max")


def _checked(path: str, f: dataclasses.Field, tp: Any, value: Any, where: str) -> Any:
    try:
        return check_value(path, f, tp, value)
    except ConfigError as error:
        raise ConfigError(f"{where}{error}") from None
