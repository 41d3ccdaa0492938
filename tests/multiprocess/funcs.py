"""Remote functions of the multiprocess tests. Every worker imports this
module under the same name, so script functions resolve by name and Python
functions pickle by reference."""

import os
import queue
import threading
import time
from typing import Dict, List, Optional, Tuple

import torch

import torchrpc as rpc
from torchrpc._extension import native

# ---- TorchScript callees (run without the GIL) ------------------------------


@torch.jit.script
def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


@torch.jit.script
def echo_list(xs: List[torch.Tensor]) -> List[torch.Tensor]:
    return xs


@torch.jit.script
def mixed(n: int, f: float, s: str, xs: Dict[str, torch.Tensor],
          maybe: Optional[torch.Tensor]) -> Tuple[int, float, str, Dict[str, torch.Tensor], bool]:
    return n + 1, f * 2.0, s + "!", xs, maybe is None


@torch.jit.script
def no_tensors(n: int) -> int:
    return n * 2


@torch.jit.script
def script_raises(x: torch.Tensor) -> torch.Tensor:
    if bool(x.sum() > 0):
        raise ValueError("positive input is not allowed here")
    return x


@torch.jit.script
def checksum(x: torch.Tensor) -> int:
    return int(x.sum())


@torch.jit.script
def busy(iterations: int) -> torch.Tensor:
    t = torch.zeros(16)
    for _ in range(iterations):
        t = t + torch.ones(16)
    return t


@torch.jit.script
def triple(x: torch.Tensor) -> torch.Tensor:
    return x * 3


rpc.register("tests.triple", triple)


# ---- Python callees (run under the GIL) -------------------------------------


class CustomError(Exception):
    """An exception type every worker can import."""


def py_add(a, b):
    return a + b


def echo(*args, **kwargs):
    if kwargs:
        return args, kwargs
    return args[0] if len(args) == 1 else args


def raise_custom(message):
    raise CustomError(message)


def raise_unimportable():
    class LocalOnly(Exception):
        pass

    raise LocalOnly("defined inside a function")


def sleep(seconds):
    time.sleep(seconds)
    return seconds


def now():
    return time.time()


def storage_nbytes(t):
    return t.untyped_storage().nbytes()


def debug_info():
    return rpc.api._debug_info()


def call(to, fn, args=(), kwargs=None, kind="rpc_sync", timeout=-1):
    """Makes a call from this worker (worker-to-worker and nested calls)."""
    if kind == "rpc_sync":
        return rpc.rpc_sync(to, fn, args=args, kwargs=kwargs, timeout=timeout)
    return rpc.rpc_async(to, fn, args=args, kwargs=kwargs, timeout=timeout).wait()


def call_expect_error(to, fn, args=(), timeout=-1):
    """Makes a call that should fail; returns (type name, message)."""
    try:
        rpc.rpc_sync(to, fn, args=args, timeout=timeout)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


class Counter:
    def __init__(self, start):
        self.value = start

    def bump(self, by):
        self.value += by
        return self.value

    def __call__(self, x):
        return x + self.value


# ---- the worker's main thread -------------------------------------------------

_main_tasks = queue.Queue()
_hold = {}


def serve_main_thread(limit):
    """Runs tasks on the worker's main thread until stop_worker(); returns its
    `graceful` flag, or None if none came within `limit` seconds."""
    deadline = time.monotonic() + limit
    while True:
        try:
            task = _main_tasks.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if isinstance(task, bool):
            return task
        task()


def stop_worker(graceful):
    _main_tasks.put(bool(graceful))


def hold_gil_on_main(seconds):
    """Makes the main thread hold the GIL for `seconds` (returns at once)."""

    def hold():
        _hold["start"] = time.time()
        native()._hold_gil_for_test(seconds)
        _hold["end"] = time.time()

    _main_tasks.put(hold)


def hold_window():
    return _hold.get("start"), _hold.get("end")


def pid():
    return os.getpid()


def thread_count():
    return threading.active_count()


# ---- RRefs (tests/multiprocess/test_rref.py) ---------------------------------

import gc  # noqa: E402
import weakref  # noqa: E402

_tracked = weakref.WeakValueDictionary()  # name -> live Tracked object
_stored = {}  # key -> RRef kept by this worker


class Tracked:
    """A value whose lifetime tests can observe on its owner."""

    def __init__(self, name, payload=None):
        self.name = name
        self.payload = payload
        _tracked[name] = self

    def get(self):
        return self.payload

    def set(self, payload):
        self.payload = payload
        return self.payload


class FailingInit:
    def __init__(self):
        raise CustomError("constructor failed on purpose")


def tracked_alive(name):
    return name in _tracked


def rref_settle():
    """Drops unreachable RRefs and waits until their deletes were answered."""
    gc.collect()
    return rpc.rref._wait_idle(10.0)


def live_rrefs():
    return rpc.rref._live_rrefs()


def rref_to_here(rref, timeout=-1):
    return rref.to_here(timeout=timeout)


def rref_to_here_error(rref, timeout=-1):
    try:
        rref.to_here(timeout=timeout)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def rref_info(rref):
    return rref.is_owner(), rref.owner_name(), rref.confirmed_by_owner()


def rref_local_value(rref):
    return rref.local_value()


def rref_forward(rref, to):
    """Passes the RRef on to worker `to`, which copies its value."""
    return rpc.rpc_sync(to, rref_to_here, args=(rref,))


def rref_to_self(rref):
    """Sends the RRef to this worker itself (owner or user)."""
    return rpc.rpc_sync(rpc.get_worker_info(), rref_info, args=(rref,))


def make_rref(value):
    """Returns an RRef owned by this worker (an RRef as a result)."""
    return rpc.RRef(value)


def make_tracked_rref(name, payload):
    return rpc.RRef(Tracked(name, payload))


def store_rref(key, rref):
    _stored[key] = rref
    return rref.is_owner()


def stored_to_here(key):
    return _stored[key].to_here()


def drop_stored(key=None):
    if key is None:
        _stored.clear()
    else:
        _stored.pop(key, None)


def remote_from_here(to, fn, args=()):
    """Makes an RRef on `to` from this worker and returns it (a user RRef result)."""
    return rpc.remote(to, fn, args=args)


def grad_tensor():
    return torch.ones(3, requires_grad=True) * 2


def rref_sum(rref):
    return rref.to_here().sum()
