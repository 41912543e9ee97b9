"""``python -m yolotrain`` (and ``torchrun -m yolotrain``) runs the command line."""

import sys

from .entry import main

if __name__ == "__main__":
    sys.exit(main())
