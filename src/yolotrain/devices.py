"""Device strings: 'cpu', 'cuda', 'cuda:N' or a bare GPU index, checked against this machine."""

from __future__ import annotations

import torch


def select_device(device: str | torch.device | None, local_rank: int = 0) -> torch.device:
    """The device to run on; ``None`` or ``""`` picks this process's GPU when there is one, else the CPU.

    Raises:
        ValueError: the string is not a device, or names a GPU this machine does not have.
    """
    if isinstance(device, torch.device):
        return device
    if device is None or device == "":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    spec = f"cuda:{device}" if device.isdigit() else device
    try:
        parsed = torch.device(spec)
    except RuntimeError:
        raise ValueError(f"bad device {device!r}: use cpu, cuda or cuda:N") from None
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"bad device {device!r}: use cpu, cuda or cuda:N")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available on this machine")
        index = local_rank if parsed.index is None else parsed.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present")
        parsed = torch.device("cuda", index)
    return parsed
