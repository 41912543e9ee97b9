"""``python -m inplace_doctor ARGS...`` is ``inplace-doctor ARGS...``."""

from .cli import run

run()
