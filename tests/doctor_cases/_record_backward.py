"""Runs a program and prints, as JSON, the value of every tensor it called backward or autograd.grad on.

``python _record_backward.py run PROGRAM`` runs backward as usual; ``forward PROGRAM`` skips it, so a
program that fails in backward still shows the forward values it meant to compute. The doctor's own
probes (a tiny backward on a thread of its own that reads PyTorch's wording) are not the program's.
"""
import json
import runpy
import sys
import threading
from pathlib import Path

import torch

mode, program = sys.argv[1], sys.argv[2]
roots: list[list] = []
real_backward, real_grad = torch.autograd.backward, torch.autograd.grad


def _record(tensors: object) -> None:
    if threading.current_thread().name.startswith("inplace-doctor-probe"):
        return
    for tensor in [tensors] if isinstance(tensors, torch.Tensor) else list(tensors):
        roots.append(tensor.detach().cpu().double().reshape(-1).tolist())


def backward(tensors, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201 - torch's own signature
    _record(tensors)
    return real_backward(tensors, *args, **kwargs) if mode == "run" else None


def grad(outputs, inputs, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201 - torch's own signature
    _record(outputs)
    if mode == "run":
        return real_grad(outputs, inputs, *args, **kwargs)
    return tuple(torch.zeros_like(x) for x in ([inputs] if isinstance(inputs, torch.Tensor) else inputs))


torch.autograd.backward, torch.autograd.grad = backward, grad
torch.manual_seed(0)
sys.path.insert(0, str(Path(program).resolve().parent))
sys.argv = [program]
runpy.run_path(program, run_name="__main__")
print("backward roots:", json.dumps(roots))
