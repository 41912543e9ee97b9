"""Class names in one normal form: a list of strings, index = class id."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


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
