"""The fast path's reading of optimiser steps: a closure keeps the tracker on the dispatch stack."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from inplace_doctor.fast_path import passes_closure
from torch.optim.optimizer import register_optimizer_step_pre_hook


def _hook_arguments(call: Callable[[torch.optim.Optimizer], Any]) -> tuple[torch.optim.Optimizer, tuple, dict]:
    """What a global step pre-hook receives when ``call(optimizer)`` steps a real optimiser."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    seen: list[tuple[torch.optim.Optimizer, tuple, dict]] = []
    handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: seen.append((opt, args, kwargs)))
    try:
        call(optimizer)
    finally:
        handle.remove()
    (arguments,) = seen
    return arguments


def _closure() -> torch.Tensor:
    return torch.zeros(())


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda opt: opt.step(), False),
        (lambda opt: opt.step(None), False),
        (lambda opt: opt.step(closure=None), False),
        (lambda opt: opt.step(_closure), True),
        (lambda opt: opt.step(closure=_closure), True),
    ],
    ids=["bare", "none-positional", "none-keyword", "closure-positional", "closure-keyword"],
)
def test_a_closure_is_told_from_the_bound_optimizer_argument(call: Callable, expected: bool) -> None:
    optimizer, args, kwargs = _hook_arguments(call)
    assert passes_closure(optimizer, args, kwargs) is expected
