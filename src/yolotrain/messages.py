"""User content inside error messages, kept to a readable size.

An error that echoes what the user gave (a YAML value, a class name, an argument) must not become
megabytes long: :func:`brief` shows a value with bounded depth and length (``reprlib``, so a huge
value is never turned into one huge string first), and :func:`shorten` bounds a finished message,
which the command line applies to every error it prints.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import reprlib
import sys
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

# Longest error message printed: room for two long paths and an explanation.
MAX_MESSAGE_CHARS = 1000

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8


def brief(value: Any) -> str:
    """``repr(value)`` with at most 8 items per container, 3 levels and 80 characters per string."""
    return _REPR.repr(value)


def shown_path(path: str | os.PathLike) -> str:
    """``path`` as written, or quoted with escapes where it holds a line break or another control character (a
    value from a YAML file may), so that the message naming it stays one line."""
    text = os.fspath(path)
    return text if text.isprintable() else repr(text)


def shorten(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` cut to ``limit`` characters, saying how many were left out."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... ({len(message) - limit} more characters)"


@contextlib.contextmanager
def one_line_warnings(prefix: str, stream: TextIO | None = None) -> Iterator[None]:
    """Within the block, each warning is shown as one line ``PREFIX: Category: message`` (no source file,
    no source line: what a command's user reads is the message), and each text only once however many
    places raise it. The filters in force (``-W``, ``PYTHONWARNINGS``) still decide which are shown."""
    shown: set[tuple[type, str]] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # warnings.showwarning's form
        text = " ".join(str(message).split())
        if (category, text) in shown:
            return
        shown.add((category, text))
        print(f"{prefix}: {category.__name__}: {shorten(text)}", file=stream or file or sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``; did you mean 'X'?`` naming the closest of ``known`` to a misspelt ``name`` ('' when none is close)."""
    close = closest_name(name, known)
    return f"; did you mean {close!r}?" if close else ""


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The name of ``known`` closest to a misspelt ``name``, if one is close enough to be meant."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None
