"""Callees of the TORCHRPC backend's tests (test_torch_backend*.py), importable
by every worker: upstream's pickler sends Python functions by reference."""

import os
import threading
import time
import typing

import torch
import torch.distributed.rpc as rpc

from tests.multiprocess import inline_calls_funcs  # noqa: F401  (its script functions, compiled on every worker)


def add(a, b):
    return a + b


def raise_value_error(text):
    raise ValueError(text)


def sleep_then(seconds, value):
    time.sleep(seconds)
    return value


def _thread_ident():
    return threading.get_ident()


class UnpickledOn:
    """Unpickles as the ident of the thread that unpickled it."""

    def __reduce__(self):
        return (_thread_ident, ())


def unpickled_on():
    return UnpickledOn()


def nested_add(via, a, b):
    """Calls `via` from inside a call (the callee's pool thread waits on it)."""
    return rpc.rpc_sync(via, torch.add, args=(a, b)) + 1


def rref_value_plus(rref, n):
    """Fetches an RRef's value from its owner (a fork, when called elsewhere)."""
    return rref.to_here() + n


def agent_address():
    """Where this worker's agent listens for TCP connections ("tcp://host:port")."""
    return rpc.api._get_current_rpc_agent().get_debug_info()["agent.address"]


def exit_soon(delay):
    """Kills this worker `delay` seconds after answering: a peer dying."""
    threading.Timer(delay, os._exit, args=(7,)).start()
    return os.getpid()


def kept_thread_states():
    """Python thread states this worker's pool threads keep (python_fallback/gil.h)."""
    from torchrpc import _C

    return _C.debug_counters()["kept_thread_states"]


_stop = threading.Event()


def request_stop():
    """Lets a dynamic job's worker leave (torch_backend_job.py waits for it)."""
    _stop.set()
    return rpc.get_worker_info().name


def wait_for_stop(timeout):
    return _stop.wait(timeout)


@torch.jit.script
def script_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


@torch.jit.script
def script_add_one_in_place(x: torch.Tensor) -> torch.Tensor:
    return x.add_(1)


def add_one_in_place(x):
    return x.add_(1)


KEPT = torch.ones(2, requires_grad=True)  # a tensor the callee keeps (a parameter, say)


def stop_grad_and_return_kept(x):
    """Changes its argument's requires-grad flag; returns this worker's KEPT
    and whether its own argument still requires grad."""
    x.requires_grad_(False)
    return KEPT, x.requires_grad


def kept_requires_grad():
    return KEPT.requires_grad


@torch.jit.script
def script_caller(dst: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """TorchScript's own rpc_async (the compiler's special form), calling script_add."""
    fut = rpc.rpc_async(dst, script_add, (a, b))
    return fut.wait()


def profiled_events(profile_rref):
    """The operator names a server-side profile (rpc._server_process_global_profile) recorded."""
    events = profile_rref.local_value().process_global_function_events  # a list per thread
    return [e.name for thread in events for e in thread]


# Lists nested 100 levels deep (message::kMaxTypeTagDepth) and one more: a
# call's type tag may nest as deep as the cap, and no deeper.
AtTheCap = typing.List[int]
for _ in range(99):
    AtTheCap = typing.List[AtTheCap]
PastTheCap = typing.List[AtTheCap]


@torch.jit.script
def len_at_the_cap(x: AtTheCap) -> int:
    return len(x)


@torch.jit.script
def len_past_the_cap(x: PastTheCap) -> int:
    return len(x)


def nested(depth):
    """[[...[1]...]], `depth` lists deep."""
    value = [1]
    for _ in range(depth - 1):
        value = [value]
    return value
