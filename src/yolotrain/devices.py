"""Device strings: 'cpu', 'cuda', 'cuda:N', a bare GPU index, a GPU list ('0,1': one process per GPU,
see :func:`gpu_list`) or 'mps' (Apple's GPU), checked against this machine."""

from __future__ import annotations

import re

import torch

BAD_DEVICE = "use cpu, cuda, cuda:N, a GPU list such as 0,1, or mps"
# Several GPU indices: the reference's "--device 0,1,2,3" (one training process each).
GPU_LIST = re.compile(r"\d+(,\d+)+")


def gpu_list(device: str | None) -> list[int]:
    """The GPU indices of a list such as ``"0,1"`` (``[]`` for any other device string)."""
    spec = (device or "").replace(" ", "")
    return [int(i) for i in spec.split(",")] if GPU_LIST.fullmatch(spec) else []


def select_device(device: str | torch.device | None, local_rank: int = 0) -> torch.device:
    """The device to run on; ``None`` or ``""`` picks this process's GPU when there is one, else the CPU.
    Of a GPU list, the process of local rank ``i`` takes the ``i``-th GPU.

    Raises:
        ValueError: the string is not a device, or names a GPU (or MPS) this machine does not have.
    """
    if isinstance(device, torch.device):
        return device
    if device is None or device == "":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if gpus := gpu_list(device):
        if local_rank >= len(gpus):
            raise ValueError(f"device {device!r} lists {len(gpus)} GPUs; process {local_rank} has none")
        device = str(gpus[local_rank])
    spec = f"cuda:{device}" if device.isdigit() else device
    try:
        parsed = torch.device(spec)
    except RuntimeError:
        raise ValueError(f"bad device {device!r}: {BAD_DEVICE}") from None
    if parsed.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"bad device {device!r}: {BAD_DEVICE}")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} requested but MPS (Apple silicon's GPU) is not available on this machine")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available on this machine")
        index = local_rank if parsed.index is None else parsed.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present")
        parsed = torch.device("cuda", index)
    return parsed


def check_gpu_list(gpus: list[int]) -> None:
    """Refuse a GPU list this machine cannot serve, in one line."""
    spec = ",".join(map(str, gpus))
    if not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} requested but CUDA is not available on this machine; for several "
                         f"CPU processes launch with torchrun --nproc_per_node {len(gpus)} and --device cpu")
    missing = [i for i in gpus if i >= torch.cuda.device_count()]
    if missing:
        raise ValueError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s) present "
                         f"(no GPU {missing[0]})")


def native_bf16() -> str | None:
    """The CPU's instructions that compute in bfloat16 natively (``AMX`` or ``AVX512-BF16``), else None.

    oneDNN runs bf16 convolutions on any AVX-512 CPU, but without these it converts to float32 and back,
    which is slower than float32 itself."""
    if torch.cpu._is_amx_tile_supported():
        return "AMX"
    if torch.cpu._is_avx512_bf16_supported():
        return "AVX512-BF16"
    return None


def native_half(device: torch.device) -> torch.dtype | None:
    """The half precision ``device`` computes natively, else None: float16 on CUDA, bfloat16 on CPUs with
    native bf16 instructions (:func:`native_bf16`). What ``--amp auto`` trains in and ``val`` and
    ``predict`` run in unless told otherwise."""
    if device.type == "cuda":
        return torch.float16
    return torch.bfloat16 if device.type == "cpu" and native_bf16() else None
