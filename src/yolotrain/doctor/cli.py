"""``yolotrain doctor``: the ``inplace-doctor`` command under yolotrain's name."""

from __future__ import annotations

from inplace_doctor.cli import main as doctor_main


def main(argv: list[str]) -> int:
    """Entry point for ``yolotrain doctor ARGS...``; returns the process exit code."""
    return doctor_main(argv, prog="yolotrain doctor")
