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


@torch.jit.script
def checked_in_a_loop(x: torch.Tensor, n: int) -> torch.Tensor:
    """Never bounded (a loop, a number argument): it runs on the pool."""
    for _ in range(n):
        x = x + 1
    if bool(x.sum() > 100):
        raise ValueError("too big")
    return x


def inline_calls():
    """Calls this worker ran on the thread that read them, so far."""
    from torchrpc import _C

    return _C.debug_counters()["inline_calls"]


class Probe:
    """Counts the calls a worker ran where it read them, through `rpc_sync`
    (torchrpc's or torch's): the tests' view of inline_calls.h."""

    def __init__(self, rpc_sync):
        self.rpc_sync = rpc_sync

    def inline_on(self, worker):
        return self.rpc_sync(worker, inline_calls)

    def calls(self, fn, args, n, worker="worker1"):
        """n calls; returns (their results, how many ran where they were read)."""
        before = self.inline_on(worker)
        results = [self.rpc_sync(worker, fn, args=args) for _ in range(n)]
        return results, self.inline_on(worker) - before

    def prove(self, fn, args, worker="worker1", streak=5, most=300):
        """Calls fn on worker until `streak` calls in a row ran on the thread
        that read them; returns how many it took. A noisy machine makes some
        runs long and the proof take longer."""
        in_a_row, seen = 0, self.inline_on(worker)
        for n in range(1, most + 1):
            self.rpc_sync(worker, fn, args=args)
            now = self.inline_on(worker)
            in_a_row, seen = (in_a_row + 1 if now > seen else 0), now
            if in_a_row == streak:
                return n
        raise AssertionError(f"{fn} did not run where it was read {streak} times in a row in {most} calls")
