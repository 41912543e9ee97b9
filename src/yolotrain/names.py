"""Class names in one normal form: a list of strings, index = class id."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from .messages import brief, shorten


class DuplicateClassNamesWarning(UserWarning):
    """A dataset names two classes alike: results by name (per-class tables) cannot tell them apart."""


def repeated_names(names: Sequence[str]) -> dict[str, list[int]]:
    """Each name given to more than one class, with its class ids."""
    ids: defaultdict[str, list[int]] = defaultdict(list)
    for i, name in enumerate(names):
        ids[name].append(i)
    return {name: where for name, where in ids.items() if len(where) > 1}


def describe_repeats(repeats: Mapping[str, list[int]]) -> str:
    """``2 names given to several classes: 'car' (ids 1, 4), 'bus' (ids 2, 3)``, bounded in length."""
    listed = ", ".join(f"{brief(name)} (ids {', '.join(map(str, ids))})" for name, ids in list(repeats.items())[:5])
    more = f" and {len(repeats) - 5} more" if len(repeats) > 5 else ""
    return shorten(f"{len(repeats)} name{'s' * (len(repeats) > 1)} given to several classes: {listed}{more}", 400)


def class_names(names: Any, nc: int | None = None) -> list[str]:
    """Class names from a list, an ``{index: name}`` mapping (keys ``0..n-1``, as ints or digit strings),
    or ``None`` (numbered names ``"0"``, ``"1"`` ..., which needs ``nc``).

    Raises:
        ValueError: names of another shape (a bare string is the usual slip: ``names: [circle]``),
            mapping keys that are not ``0..n-1``, or a count that differs from ``nc``.
    """
    if names is None:
        if nc is None:
            raise ValueError("no class names and no class count")
        return [str(i) for i in range(nc)]
    if isinstance(names, Mapping):
        try:
            keyed = {int(k): v for k, v in names.items()}
        except (TypeError, ValueError):
            raise ValueError(f"class names mapping needs integer keys 0..n-1, got {sorted(map(str, names))}") \
                from None
        if sorted(keyed) != list(range(len(keyed))):
            raise ValueError(f"class names mapping needs keys 0..{len(keyed) - 1}, got {sorted(keyed)}")
        listed = [keyed[i] for i in range(len(keyed))]
    elif isinstance(names, Sequence) and not isinstance(names, (str, bytes)):
        listed = list(names)
    else:
        raise ValueError(f"class names must be a list (e.g. [{names}]) or a {{0: name}} mapping, got {names!r}")
    if any(isinstance(n, (Mapping, list, tuple, set)) or n is None for n in listed):
        raise ValueError(f"class names must be plain names, got {listed!r}")
    if nc is not None and len(listed) != nc:
        raise ValueError(f"{len(listed)} class names for {nc} classes")
    return [str(n) for n in listed]
