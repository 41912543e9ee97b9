"""Exits with status 3 after printing its arguments; checks argv and exit-code passthrough."""
import sys

import torch

x = torch.ones(2, requires_grad=True)
(x * x).sum().backward()
print("args:", sys.argv[1:], "main:", __name__)
sys.exit(3)
