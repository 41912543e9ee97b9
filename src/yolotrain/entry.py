"""The ``yolotrain`` console script and ``python -m yolotrain``: ``doctor`` starts without the rest.

``yolotrain doctor`` runs a user's script under the stand-alone in-place doctor, which needs torch alone;
importing the command line (``cli.py``: OpenCV, torchvision, the training engine, every command's
options) would double its start-up. Every other command goes to ``cli.main``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .doctor.cli import main as doctor_main


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``yolotrain ARGS...`` (``sys.argv[1:]`` when ``argv`` is None); returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        return doctor_main(argv[1:])
    from .cli import main as command_line_main  # the whole API: only for the commands that use it

    return command_line_main(argv)
