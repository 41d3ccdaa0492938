"""Callees of the profiler tests: they run on other workers."""

import torch

import torchrpc as rpc


def mul_in_a_range(x):
    """Runs an op inside a named range on the callee."""
    with torch.autograd.profiler.record_function("##callee_range##"):
        return torch.mul(x, 2)


def add_via(to, x):
    """Calls `to` from the callee: a nested RPC."""
    return rpc.rpc_sync(to, torch.add, args=(x, 1))


@torch.jit.script
def script_sub(x: torch.Tensor) -> torch.Tensor:
    return x - 1


def global_profile_events(profile_rref):
    """On the profiled worker: the names of each served request's events."""
    return [[e.name for e in request] for request in profile_rref.local_value().process_global_function_events]
