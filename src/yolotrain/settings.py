"""The machinery behind the configuration tree: typed, frozen dataclasses of settings.

Each stage defines its own small dataclass next to the code that reads it (``AugmentConfig`` in
``data/augment.py``, ``LossConfig`` in ``loss/detect.py`` ...); :class:`yolotrain.engine.TrainConfig` holds
them. Every field is declared with :func:`setting`, which records its one-line help, its command-line
flags and its bounds, so that validation and the ``train`` command line are generated from the one
declaration and a default is written once.

A configuration is built from plain values (a YAML file, parsed options, keyword arguments) by
:func:`from_mapping`, which checks every value against its field's type and bounds and raises one
:class:`ConfigError` naming the field, and suggests the closest name for a typo.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TypeVar, Union

from .messages import brief, did_you_mean

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting with a wrong name, type or value; the message names the setting."""


def setting(default: Any, help: str, *, flags: tuple[str, ...] = (), aliases: tuple[str, ...] = (),
            min: float | None = None, max: float | None = None, above: float | None = None,
            multiple_of: int | None = None, off_flags: tuple[str, ...] = (), const: Any = None) -> Any:
    """A configuration field: its default, one line of help, and what makes a value valid.

    Args:
        default: the value when nobody sets it (``None`` where the run picks it, as the help says).
        help: one line, shown by ``--help``.
        flags: command-line spellings (default ``--field-name``).
        aliases: other keyword names accepted for it (e.g. ``data`` for ``DataConfig.path``).
        min, max: inclusive bounds; above: exclusive lower bound; multiple_of: for sizes.
        off_flags: extra spellings that turn a true/false setting off (the reference's ``--noautoanchor``).
        const: the value of the option given without one (``--cache`` alone means ``ram``).
    """
    meta = {"help": help, "flags": flags, "aliases": aliases, "min": min, "max": max, "above": above,
            "multiple_of": multiple_of, "off_flags": off_flags, "const": const}
    return dataclasses.field(default=default, metadata=meta)


def is_section(tp: Any) -> bool:
    """Whether a resolved field type is a nested configuration dataclass."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotations of a configuration dataclass (``from __future__`` strings evaluated)."""
    return typing.get_type_hints(cls)


def leaves(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """Every setting of ``cls`` and its sections as ``(dotted path, field, type)``, in declaration order."""
    types_ = field_types(cls)
    for f in dataclasses.fields(cls):
        tp = types_[f.name]
        if is_section(tp):
            yield from leaves(tp, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, tp


def flat_names(cls: type) -> dict[str, str]:
    """Flat keyword → dotted path for every setting (field names and their aliases)."""
    names: dict[str, str] = {}
    for path, f, _ in leaves(cls):
        for name in (f.name, *f.metadata.get("aliases", ())):
            if name in names:
                raise TypeError(f"{cls.__name__}: setting name {name!r} is used by {names[name]} and {path}")
            names[name] = path
    return names


def unknown_name_error(name: str, known: list[str], where: str = "") -> ConfigError:
    """The error for a name that is not a setting, with the closest valid name when there is one."""
    return ConfigError(f"{where}unknown setting {name!r}{did_you_mean(name, known)}")


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is tuple:
        item = typing.get_args(tp)[0]
        if typing.get_origin(item) is Literal:
            return "a list of " + ", ".join(repr(v) for v in typing.get_args(item))
        return f"a list of {_describe(item)}s"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp: Any) -> Any:
    """``value`` as type ``tp``, or raise ``TypeError``. Exact where YAML and argparse already typed it."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return _coerce(value, option)
            except TypeError:
                continue
        raise TypeError
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise TypeError
    if origin is tuple:  # tuple[X, ...]: a list in YAML/JSON, one or more values on the command line
        items = value if isinstance(value, (list, tuple)) else [value]
        return tuple(_coerce(part, typing.get_args(tp)[0]) for item in items for part in _comma_parts(item))
    if tp is type(None):
        if value is None:
            return None
        raise TypeError
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise TypeError
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise TypeError
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise TypeError
            return float(value)
        raise TypeError
    if tp is str:
        if isinstance(value, str):
            return value
        raise TypeError
    raise TypeError


def _comma_parts(item: Any) -> list[Any]:
    """``"mlflow,wandb"`` as two list items (a comma-separated list is one command-line value)."""
    return [part.strip() for part in item.split(",")] if isinstance(item, str) and "," in item else [item]


def _closest_choice(value: Any, tp: Any) -> str:
    """``; did you mean 'X'?`` for a misspelt choice of a setting with fixed choices (or a list of them)."""
    tp = base_type(tp)
    values = value if isinstance(value, (list, tuple)) else [value]
    if typing.get_origin(tp) is tuple:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) is not Literal:
        return ""
    choices = [c for c in typing.get_args(tp) if isinstance(c, str)]
    for part in (p for item in values for p in _comma_parts(item)):
        if isinstance(part, str) and part not in choices:
            close = difflib.get_close_matches(part, choices, n=1, cutoff=0.6)
            return f"; did you mean {close[0]!r}?" if close else ""
    return ""


def check_value(path: str, f: dataclasses.Field, tp: Any, value: Any) -> Any:
    """``value`` coerced to the field's type and checked against its bounds; ``ConfigError`` otherwise."""
    try:
        value = _coerce(value, tp)
    except TypeError:
        raise ConfigError(f"{path}: expected {_describe(tp)}, got {brief(value)}{_closest_choice(value, tp)}") from None
    for number in value if isinstance(value, tuple) else (value,):
        _check_bounds(path, f, number)
    return value


def _check_bounds(path: str, f: dataclasses.Field, value: Any) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        meta = f.metadata
        if meta.get("min") is not None and value < meta["min"]:
            raise ConfigError(f"{path}: must be at least {meta['min']:g}, got {value:g}")
        if meta.get("max") is not None and value > meta["max"]:
            raise ConfigError(f"{path}: must be at most {meta['max']:g}, got {value:g}")
        if meta.get("above") is not None and value <= meta["above"]:
            raise ConfigError(f"{path}: must be greater than {meta['above']:g}, got {value:g}")
        if meta.get("multiple_of") and value % meta["multiple_of"]:
            raise ConfigError(f"{path}: must be a positive multiple of {meta['multiple_of']}, got {value:g}")


def from_mapping(cls: type[T], values: Mapping[str, Any], path: str = "") -> T:
    """Build and validate ``cls`` from a nested mapping (missing settings keep their defaults).

    Raises:
        ConfigError: an unknown name (with the closest valid one), a wrong type, or a value out of bounds.
    """
    if not isinstance(values, Mapping):
        raise ConfigError(f"{path.rstrip('.') or cls.__name__}: expected a mapping of settings, got {brief(values)}")
    types_ = field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        if name not in fields:
            raise unknown_name_error(str(name), list(fields), f"{path.rstrip('.')}: " if path else "")
        tp = types_[name]
        if is_section(tp):
            kwargs[name] = value if isinstance(value, tp) else from_mapping(tp, value, f"{path}{name}.")
        else:
            kwargs[name] = check_value(f"{path}{name}", fields[name], tp, value)
    return cls(**kwargs)


def validate(config: Any, path: str = "") -> None:
    """Check every setting of an already-built configuration (e.g. one made with ``dataclasses.replace``)."""
    types_ = field_types(type(config))
    for f in dataclasses.fields(config):
        value, tp = getattr(config, f.name), types_[f.name]
        if is_section(tp):
            if not isinstance(value, tp):
                raise ConfigError(f"{path}{f.name}: expected a {tp.__name__}, got {brief(value)}")
            validate(value, f"{path}{f.name}.")
        else:
            check_value(f"{path}{f.name}", f, tp, value)


def to_dict(config: Any) -> dict[str, Any]:
    """Nested plain-value form (JSON and YAML ready: tuples become lists)."""
    return dataclasses.asdict(config, dict_factory=lambda items: {k: list(v) if isinstance(v, tuple) else v
                                                                  for k, v in items})


def nest(cls: type, flat: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """Turn flat keywords (``lr0=0.02``, ``mosaic=0``, ``data="x.yaml"``) into the nested form of ``cls``.

    Section names are accepted too, with a mapping or a section instance as the value.
    """
    names = flat_names(cls)
    sections = {f.name for f in dataclasses.fields(cls) if is_section(field_types(cls)[f.name])}
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        if key in sections and (isinstance(value, Mapping) or dataclasses.is_dataclass(value)):
            # A whole section; a plain value under a section's name is that name's flat alias (data=PATH).
            nested[key] = merge(nested.get(key, {}), to_dict(value) if dataclasses.is_dataclass(value) else value)
            continue
        if key not in names:
            raise unknown_name_error(key, sorted(set(names) | sections), where)
        *parents, leaf = names[key].split(".")
        node = nested
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return nested


def from_flat(cls: type[T], flat: Mapping[str, Any]) -> T:
    """Build and validate ``cls`` from flat keywords (``conf=0.1``) over all its defaults: a section keeps
    its field's default instance for what is not given (val's NMS section is not predict's)."""
    return from_mapping(cls, merge(to_dict(cls()), nest(cls, flat)))


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Nested mappings merged, ``update`` winning."""
    out = dict(base)
    for key, value in update.items():
        out[key] = merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) \
            else value
    return out


_METAVARS = {int: "N", float: "X", str: "TEXT"}


def add_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (),
                  required: tuple[str, ...] = ()) -> None:
    """One option per setting of ``cls``, grouped by section, help and defaults from the declarations.

    Options that are not given do not appear in the parsed namespace (``argparse.SUPPRESS``), so the
    caller can tell an explicit value from a default. Each option's ``dest`` is the setting's flat name.
    A section's defaults are those of its field's default instance (val's NMS section is not predict's).
    The settings named in ``required`` must be given.
    """
    groups: dict[str, argparse._ArgumentGroup] = {}
    defaults = section_defaults(cls)
    for path, f, tp in leaves(cls):
        if f.name in skip:
            continue
        section = path.rpartition(".")[0] or "run"
        group = groups.get(section) or groups.setdefault(section, parser.add_argument_group(f"{section} settings"))
        flags = f.metadata.get("flags") or (f"--{f.name.replace('_', '-')}",)
        default = getattr(defaults[section], f.name) if section in defaults else \
            f.default if f.default is not dataclasses.MISSING else None
        shown = "" if default in (None, ()) else f" (default {default})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": f.metadata["help"] + shown,
                                  "required": f.name in required}
        base = base_type(tp)
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
            for off in f.metadata.get("off_flags", ()):  # hidden: --help shows the --no-NAME form
                group.add_argument(off, dest=f.name, action="store_false", default=argparse.SUPPRESS,
                                   help=argparse.SUPPRESS)
        elif typing.get_origin(base) is Literal:
            kwargs.update(choices=typing.get_args(base), type=any_case(typing.get_args(base)))
        elif typing.get_origin(base) is tuple:
            item = typing.get_args(base)[0]
            if typing.get_origin(item) is Literal:  # names checked with the setting, which suggests the closest
                kwargs.update(nargs="+", metavar="NAME", type=any_case(typing.get_args(item)))
            else:
                kwargs.update(nargs="+", type=item, metavar=_METAVARS.get(item))
        else:
            kwargs["type"] = base
            kwargs["metavar"] = _METAVARS.get(base)
        if f.metadata.get("const") is not None:
            kwargs.update(nargs="?", const=f.metadata["const"])
        group.add_argument(*flags, **kwargs)


def any_case(choices: tuple[Any, ...]) -> Any:
    """The command-line type of a setting with fixed choices: a choice spelt in any case is that choice
    (``--optimizer adam`` is ``Adam``), each of a comma-separated list; anything else is checked as given."""
    spelt = {choice.lower(): choice for choice in choices if isinstance(choice, str)}

    def choice(text: str) -> Any:
        return ",".join(spelt.get(part.lower(), part) for part in text.split(","))

    return choice


def section_defaults(cls: type, prefix: str = "") -> dict[str, Any]:
    """Dotted section path → the default instance of each section of ``cls`` that has one."""
    found: dict[str, Any] = {}
    types_ = field_types(cls)
    for f in dataclasses.fields(cls):
        if is_section(types_[f.name]) and f.default_factory is not dataclasses.MISSING:
            found[f"{prefix}{f.name}"] = f.default_factory()
            found.update(section_defaults(types_[f.name], f"{prefix}{f.name}."))
    return found


def flat_values(config: Any) -> dict[str, Any]:
    """Flat name → value of every setting of a built configuration (``conf`` for ``nms.conf`` ...)."""
    values: dict[str, Any] = {}
    for path, f, _ in leaves(type(config)):
        node = config
        for part in path.split("."):
            node = getattr(node, part)
        values[f.name] = node
    return values


class _Refused(argparse.Action):
    """Records a refused option (with or without its value) so the command stops on it in one line."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        namespace.refused = [*getattr(namespace, "refused", []), option_string]


def add_refused(parser: argparse.ArgumentParser, refusals: Mapping[str, str]) -> None:
    """Hidden options (flag → why it is not supported) that parse, with or without a value, and are then
    refused in one line by :func:`check_refused`, rather than reported as unrecognised."""
    for flag in refusals:
        parser.add_argument(flag, nargs="?", action=_Refused, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def check_refused(args: argparse.Namespace, refusals: Mapping[str, str]) -> None:
    """``ValueError`` naming the first refused option given, and why it is not supported."""
    refused = getattr(args, "refused", [])
    if refused:
        raise ValueError(f"{refused[0]} is not supported: {refusals[refused[0]]}")


def base_type(tp: Any) -> Any:
    """``int`` for ``int | None`` and the like: the type a command-line value is parsed as."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return options[0] if len(options) == 1 else str
    return tp
