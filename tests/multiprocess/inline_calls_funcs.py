"""Callees of test_inline_calls.py (importable by every worker)."""

import warnings

import torch

warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated in 2.13


@torch.jit.script
def add_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@torch.jit.script
def outer_sum(x: torch.Tensor) -> torch.Tensor:
    """Short for a few elements; for 4,096 it fills 16M (milliseconds)."""
    return torch.outer(x, x).sum()


@torch.jit.script
def ones_of_size(n: int) -> torch.Tensor:
    """A number argument sizes what it makes: never run where it was read."""
    return torch.ones(n)


@torch.jit.script
def add_in_a_loop(x: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        x = x + 1
    return x


@torch.jit.script
def checked(x: torch.Tensor) -> torch.Tensor:
    if bool(x.sum() > 100):
        raise ValueError("too big")
    return x * 2


def inline_calls():
    """Calls this worker ran on the thread that read them, so far."""
    from torchrpc import _C

    return _C.debug_counters()["inline_calls"]
