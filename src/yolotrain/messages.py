"""User content inside error messages, kept to a readable size.

An error that echoes what the user gave (a YAML value, a class name, an argument) must not become
megabytes long: :func:`brief` shows a value with bounded depth and length (``reprlib``, so a huge
value is never turned into one huge string first), and :func:`shorten` bounds a finished message,
which the command line applies to every error it prints.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable
from typing import Any

# Longest error message printed: room for two long paths and an explanation.
MAX_MESSAGE_CHARS = 1000

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8


def brief(value: Any) -> str:
    """``repr(value)`` with at most 8 items per container, 3 levels and 80 characters per string."""
    return _REPR.repr(value)


def shorten(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` cut to ``limit`` characters, saying how many were left out."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... ({len(message) - limit} more characters)"


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``; did you mean 'X'?`` naming the closest of ``known`` to a misspelt ``name`` ('' when none is close)."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
