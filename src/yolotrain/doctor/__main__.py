"""``python -m yolotrain.doctor ARGS...`` is ``yolotrain doctor ARGS...``."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
