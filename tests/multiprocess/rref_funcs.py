"""Remote functions of the RRef tests (test_rref*.py, test_script_rref.py):
values whose lifetime the tests observe, helpers that send RRefs on, and
TorchScript functions that use RRefs. Every worker imports this module
under the same name, as funcs."""

import gc
import time
import weakref
from typing import Any, List, Tuple

import torch

import torchrpc as rpc
from tests.multiprocess.funcs import CustomError, script_raises

# ---- RRefs (tests/multiprocess/test_rref.py) ---------------------------------

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


# ---- RRefs inside TorchScript (tests/multiprocess/test_script_rref.py) ----------


@torch.jit.script
def script_remote(owner: str, x: torch.Tensor) -> rpc.RRef:
    """remote() from TorchScript: an RRef of add(x, x) owned by `owner`."""
    return rpc.remote(owner, "tests.add", args=(x, x))


@torch.jit.script
def _tensor(value: Any) -> torch.Tensor:
    assert isinstance(value, torch.Tensor)
    return value


@torch.jit.script
def script_to_here(rref: rpc.RRef) -> torch.Tensor:
    return _tensor(rref.to_here())


@torch.jit.script
def script_rref_info(rref: rpc.RRef) -> Tuple[str, bool]:
    return rref.owner_name(), rref.is_owner()


@torch.jit.script
def script_rref_confirmed(rref: rpc.RRef) -> bool:
    return rref.confirmed_by_owner()


@torch.jit.script
def script_local_value(rref: rpc.RRef) -> torch.Tensor:
    return _tensor(rref.local_value())


@torch.jit.script
def script_bump_then_raise(rref: rpc.RRef) -> torch.Tensor:
    """Adds 1 to the RRef's tensor on its owner, then raises a RuntimeError."""
    value = _tensor(rref.local_value())
    value.add_(1)
    if bool(value.sum() > -1.0):
        raise RuntimeError("bumped, then raised")
    return value


@torch.jit.script
def script_remote_then_fetch(owner: str, x: torch.Tensor, timeout: float = -1.0) -> torch.Tensor:
    rref = rpc.remote(owner, "tests.add_with_default", args=(x, x), kwargs={"scale": 2.0})
    return _tensor(rref.to_here(timeout))


@torch.jit.script
def script_remote_busy_then_fetch(owner: str, iterations: int, timeout: float) -> torch.Tensor:
    rref = rpc.remote(owner, "tests.busy", args=(iterations,))
    return _tensor(rref.to_here(timeout))


@torch.jit.script
def script_sum_rrefs(rrefs: List[rpc.RRef[torch.Tensor]]) -> torch.Tensor:
    total = torch.zeros(3)
    for r in rrefs:
        value = r.to_here()
        assert isinstance(value, torch.Tensor)
        total = total + value
    return total


@torch.jit.script
def script_forward_rref(rref: rpc.RRef, to: str) -> torch.Tensor:
    """Passes the RRef on, from TorchScript, to worker `to`, which fetches it."""
    out = rpc.rpc_sync(to, "tests.script_to_here", args=(rref,))
    assert isinstance(out, torch.Tensor)
    return out


@torch.jit.script
def script_remote_failing(owner: str, x: torch.Tensor) -> rpc.RRef:
    return rpc.remote(owner, "tests.script_raises", args=(x,))


rpc.register("tests.script_to_here", script_to_here)
rpc.register("tests.script_remote", script_remote)
rpc.register("tests.script_raises", script_raises)


class RemoteDoubler(torch.nn.Module):
    """A deployable module whose forward creates a remote value and fetches it."""

    def __init__(self, owner: str):
        super().__init__()
        self.owner = owner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rref = rpc.remote(self.owner, "tests.add", args=(x, x))
        value = rref.to_here()
        assert isinstance(value, torch.Tensor)
        return value + 1

    @torch.jit.export
    def make(self, x: torch.Tensor) -> rpc.RRef:
        return rpc.remote(self.owner, "tests.add", args=(x, x))


def live_rref_counts():
    """(owner objects, user RRefs) on this worker."""
    live = rpc.rref._live_rrefs()
    return len(live["owner_objects"]), len(live["users"])


def rref_of_python_value(x):
    return rpc.RRef(x)


def remote_and_keep(key, to, name):
    """Makes a Tracked value `name` on `to` and keeps its RRef here under `key`
    (a fork this worker holds), once the value exists."""
    rref = rpc.remote(to, Tracked, args=(name,))
    rref.rpc_sync().get()
    _stored[key] = rref


def owner_entries(prefix):
    """How many owner entries of this worker have an RRef id starting with `prefix`."""
    return sum(1 for rid, *_ in rpc.rref._live_rrefs()["owners"] if rid.startswith(prefix))


class Slow:
    """A value whose creation takes `seconds` (the constructor sleeps)."""

    def __init__(self, seconds):
        time.sleep(seconds)

    def echo(self, x):
        return x
