"""Remote functions of the multiprocess tests. Every worker imports this
module under the same name, so script functions resolve by name and Python
functions pickle by reference."""

import contextlib
import ctypes
import os
import queue
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

import torchrpc as rpc
from torchrpc._extension import native

# ---- TorchScript callees (run without the GIL) ------------------------------


@torch.jit.script
def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


@torch.jit.script
def add_one_in_place(x: torch.Tensor) -> torch.Tensor:
    """Changes its argument, and returns it."""
    return x.add_(1)


def py_add_one_in_place(x):
    return x.add_(1)


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
rpc.register("tests.add", add)


@torch.jit.script
def add_with_default(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return (a + b) * scale


rpc.register("tests.add_with_default", add_with_default)


@torch.jit.script
def times_four(x: torch.Tensor) -> torch.Tensor:
    return x * 4


# One function under two names, both before init_rpc: both are served.
rpc.register("tests.times_four", times_four)
rpc.register("tests.quadruple", times_four)
rpc.register("tests.busy", busy)


# ---- TorchScript callers (RPC from inside TorchScript) -------------------------


@torch.jit.script
def script_calls_async(to: str, x: torch.Tensor) -> torch.Tensor:
    fut = rpc.rpc_async(to, "tests.add", args=(x, x))
    out = fut.wait()
    assert isinstance(out, torch.Tensor)
    return out


@torch.jit.script
def script_calls_sync(to: str, x: torch.Tensor, scale: float) -> torch.Tensor:
    out = rpc.rpc_sync(to, "tests.add_with_default", args=(x, x), kwargs={"scale": scale})
    assert isinstance(out, torch.Tensor)
    return out


@torch.jit.script
def script_fans_out(peers: List[str], x: torch.Tensor) -> torch.Tensor:
    futs = [rpc.rpc_async(p, "tests.triple", args=(x,)) for p in peers]
    total = torch.zeros_like(x)
    for fut in futs:
        out = torch.jit.wait(fut)
        assert isinstance(out, torch.Tensor)
        total = total + out
    return total


@torch.jit.script
def script_nested(me: str, other: str, x: torch.Tensor) -> torch.Tensor:
    """Runs on `me`; calls `other`, which calls `me` back: with one pool
    thread per worker this completes only if waiting frees the thread."""
    out = rpc.rpc_async(other, "tests.script_calls_async", args=(me, x)).wait()
    assert isinstance(out, torch.Tensor)
    return out + 1


rpc.register("tests.script_calls_async", script_calls_async)


@torch.jit.script
def _calls_back(me: str, other: str, x: torch.Tensor) -> torch.Tensor:
    out = rpc.rpc_async(other, "tests.script_calls_async", args=(me, x)).wait()
    assert isinstance(out, torch.Tensor)
    return out


@torch.jit.script
def script_forks_nested(me: str, other: str, x: torch.Tensor) -> torch.Tensor:
    """Runs on `me`: forks a task that calls `other`, which calls `me` back,
    and waits for the task: on one pool thread, only if waiting frees it."""
    task = torch.jit._fork(_calls_back, me, other, x)
    return torch.jit._wait(task) + 1


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


def loop_events_served_by_others():
    """Events of this process's transport that pool threads read themselves."""
    from torchrpc import _C

    return _C.debug_counters()["loop_events_served_by_others"]


def polls_withheld():
    """Polls this process's wait policy refused (common/wait_policy.h)."""
    from torchrpc import _C

    return _C.debug_counters()["polls_withheld"]


def pool_tasks():
    """Tasks queued on this process's thread pools so far (this call's own included)."""
    from torchrpc import _C

    return _C.debug_counters()["pool_tasks"]


def forget_python_functions():
    """Empties this worker's cache of Python functions callers sent in full
    (as a full cache or a restart would); returns how many it held."""
    from torchrpc import python_fallback

    with python_fallback._lock:
        held = len(python_fallback._received)
        python_fallback._received.clear()
    return held


def sleep(seconds):
    time.sleep(seconds)
    return seconds


def now():
    return time.time()


def compute_for(seconds):
    """Torch ops under the GIL for `seconds` (wall time); returns (start, end)
    on this worker's time.perf_counter clock."""
    x, start = torch.ones(8), time.perf_counter()
    while time.perf_counter() - start < seconds:
        x = x * 0.999 + 0.001
    return start, time.perf_counter()


def overlapping_pairs(rpc_async, to, seconds, pairs=6):
    """Caller side: starts `pairs` pairs of compute_for(seconds) calls on `to`
    with `rpc_async` (torchrpc's or upstream's), a pair at once; returns how
    many pairs ran side by side on the callee."""
    overlaps = 0
    for _ in range(pairs):
        a, b = (rpc_async(to, compute_for, args=(seconds,)) for _ in range(2))
        (a_start, a_end), (b_start, b_end) = a.wait(), b.wait()
        overlaps += a_start < b_end and b_start < a_end
    return overlaps


def storage_nbytes(t):
    return t.untyped_storage().nbytes()


def nested(depth):
    """0 inside `depth` tuples, built on the callee (a caller's pickle would refuse it first)."""
    value = 0
    for _ in range(depth):
        value = (value,)
    return value


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


class Echo:
    """A remote object whose methods return what they were given, and what
    the owner saw of it (for RRef proxies)."""

    def __init__(self):
        self._busy = threading.Lock()

    def value(self, v):
        return v

    def call(self, *args, **kwargs):
        return args, kwargs

    def seen(self, *args, **kwargs):
        """The owner's view of the arguments: types, and requires_grad of tensors."""
        def describe(v):
            if isinstance(v, torch.Tensor):
                return (type(v).__name__, v.requires_grad)
            if isinstance(v, (tuple, list)):
                return (type(v).__name__, [describe(x) for x in v])
            if isinstance(v, dict):
                return ("dict", {k: describe(x) for k, x in v.items()})
            return type(v).__name__
        return describe(args), describe(kwargs)

    def size_of(self, t):
        return t.size()

    def grad_result(self):
        return torch.ones(2, requires_grad=True) * 2

    def fail(self, message):
        raise CustomError(message)

    def sleep(self, seconds):
        with self._busy:
            time.sleep(seconds)
        return seconds

    def wait_idle(self):
        """Returns once no sleep() runs."""
        with self._busy:
            return True


# ---- the worker's main thread -------------------------------------------------

_main_tasks = queue.Queue()
_hold = {}
_hold_ended = threading.Event()


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


def main_thread_runs(timeout=30.0):
    """Whether the worker's main thread runs tasks (so its init_rpc returned)
    within `timeout` seconds."""
    ran = threading.Event()
    _main_tasks.put(ran.set)
    return ran.wait(timeout)


def stop_worker(graceful):
    _main_tasks.put(bool(graceful))


def hold_gil_on_main(seconds):
    """Makes the main thread hold the GIL for `seconds` (returns at once)."""

    def hold():
        _hold["start"] = time.time()
        _sleep_holding_gil(seconds)
        _hold["end"] = time.time()
        _hold_ended.set()

    _hold.clear()
    _hold_ended.clear()
    _main_tasks.put(hold)


def _sleep_holding_gil(seconds):
    # One C call through a PyDLL, which keeps the GIL during it (glibc's
    # usleep takes more than a second).
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


def hold_window():
    """(start, end) of the last hold_gil_on_main, once it ended (a Python call
    may run between the end of the hold and the main thread noting it)."""
    _hold_ended.wait(30)
    return _hold.get("start"), _hold.get("end")


@contextlib.contextmanager
def gil_held_on(worker, what, seconds=3.0):
    """Runs the block (on the caller) while `worker`'s main thread holds its GIL
    for `seconds`, and asserts that the block ran within that hold (`what`
    names the block in the failure)."""
    rpc.rpc_sync(worker, hold_gil_on_main, args=(seconds,))
    time.sleep(0.5)  # let the main thread take the GIL
    started = time.time()
    yield
    finished = time.time()
    start, end = rpc.rpc_sync(worker, hold_window, timeout=30)  # a Python call: after the hold
    assert end - start >= seconds - 0.01
    assert start <= started and finished <= end, (
        f"{what} ran from {started:.3f} to {finished:.3f}; {worker} held its GIL from {start:.3f} to {end:.3f}")


def pid():
    return os.getpid()


def thread_count():
    return threading.active_count()


def serving_thread():
    """The OS thread (id, name) running this call."""
    return threading.get_native_id(), _thread_name(threading.get_native_id())


def _thread_name(tid):
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().strip()


def same_host_copied_bytes():
    """Bytes this worker copied from its peers' memory (csrc/transport/same_host)."""
    return native().debug_counters()["same_host_copied_bytes"]


def verify_same_host_offer(offer):
    """(pid, "") if this worker can read the memory of the process that made `offer`, else (-1, why)."""
    from tests.csrc import hooks

    return hooks().same_host_verify(offer)


def thread_names():
    """The names of this process's threads."""
    return {_thread_name(tid) for tid in os.listdir("/proc/self/task")}


def stop_worker_later(delay, call_back_to):
    """Makes the worker call `call_back_to`, then shut down gracefully,
    `delay` seconds from now (returns at once)."""

    def later():
        time.sleep(delay)
        value = rpc.rpc_sync(call_back_to, no_tensors, args=(21,))
        print(f"call back during shutdown returned {value}", flush=True)
        # a Python callee that uses torchrpc itself, while its worker shuts down
        info = rpc.rpc_sync(call_back_to, rpc.get_worker_info)
        print(f"get_worker_info during shutdown returned {info.name}", flush=True)
        _main_tasks.put(True)

    _main_tasks.put(later)


# ---- @async_execution callees ------------------------------------------------


@rpc.functions.async_execution
def async_add_chained(to, x, y, z):
    return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)


@rpc.functions.async_execution
def async_returns_a_value():
    return 42  # not a Future: the caller gets a RuntimeError naming the function


@rpc.functions.async_execution
@torch.jit.script
def async_script_returns_a_tensor(x: torch.Tensor) -> torch.Tensor:
    return x  # not a Future: decorating is fine, calling fails


@rpc.functions.async_execution
@torch.jit.script
def async_script_add(to: str, x: torch.Tensor, y: torch.Tensor) -> torch.jit.Future[Any]:
    return rpc.rpc_async(to, "tests.add", args=(x, y))


class AsyncMath:
    def __init__(self, z):
        self.z = z

    @staticmethod
    @rpc.functions.async_execution
    def static_async_add(to, x, y, z):
        return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)

    @classmethod
    @rpc.functions.async_execution
    def class_async_add(cls, to, x, y, z):
        ret = torch.futures.Future()
        rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: ret.set_result(fut.wait() + z))
        return ret

    @rpc.functions.async_execution
    def bound_async_add(self, to, x, y):
        return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + self.z)


# ---- TorchScript deployment ------------------------------------------------------


class Shards(torch.nn.Module):
    """Sums what each shard worker returns for x: a module whose forward calls
    torchrpc, to be scripted, saved and loaded elsewhere."""

    def __init__(self, shards: List[str]):
        super().__init__()
        self.shards = shards

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        futs = [rpc.rpc_async(s, "tests.triple", args=(x,)) for s in self.shards]
        total = torch.zeros_like(x)
        for fut in futs:
            out = fut.wait()
            assert isinstance(out, torch.Tensor)
            total = total + out
        return total


def load_and_run(path, x):
    return torch.jit.load(path)(x)


def call_many(to, n, iterations):
    """n back-to-back rpc_sync of busy(iterations) to `to`; returns calls/s."""
    started = time.perf_counter()
    for _ in range(n):
        rpc.rpc_sync(to, busy, args=(iterations,))
    return n / (time.perf_counter() - started)


def call_repeatedly(to, fn, args, n):
    """n back-to-back rpc_sync of fn(*args) to `to`, from this worker."""
    for _ in range(n):
        rpc.rpc_sync(to, fn, args=args)


_running = {"now": 0, "most": 0}
_running_lock = threading.Lock()


def sleep_counting(seconds):
    """Sleeps, counting how many such calls run at once on this worker."""
    with _running_lock:
        _running["now"] += 1
        _running["most"] = max(_running["most"], _running["now"])
    time.sleep(seconds)
    with _running_lock:
        _running["now"] -= 1


def most_running(reset=False):
    """The most sleep_counting calls that ran at once here (then 0 if reset)."""
    with _running_lock:
        most = _running["most"]
        if reset:
            _running["most"] = 0
        return most


def call_back_and_sleep(to, seconds):
    """A nested call to `to` (which sleeps there), made while this one runs."""
    return rpc.rpc_sync(to, sleep, args=(seconds,))


def zeros(numel):
    return torch.zeros(numel)


# ---- error compatibility -------------------------------------------------------


def identity(x):
    return x


def reset_log_limits():
    """Forgets the lines torchrpc.log wrote lately (so a test sees the next one)."""
    from torchrpc import log

    log._recent.clear()


def make_future():
    return torch.futures.Future()  # cannot be pickled: the call fails with RuntimeError


def stderr_of_a_failing_call(callee):
    """What this worker's stderr shows while `callee` runs a failing call of it."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rpc.rpc_sync(callee, call, args=(rpc.get_worker_info().name, raise_custom, ("logged on the callee",)))
        except CustomError:
            pass
    return err.getvalue()


def call_missing_function(caller):
    """Asks `caller` to run a function of this module that only this worker has."""
    global only_on_the_caller

    def only_on_the_caller():
        return 1

    only_on_the_caller.__qualname__ = "only_on_the_caller"
    try:
        return rpc.rpc_sync(caller, only_on_the_caller)
    finally:
        del only_on_the_caller


def worker_names():
    """The names of the workers this worker knows now (a dynamic job's change)."""
    return [w.name for w in rpc.api._get_current_rpc_agent().get_worker_infos()]


# ---- TorchScript: distributed autograd, modules through Python calls -------------


@torch.jit.script
def script_backward_and_gradients(context_id: int, loss: torch.Tensor) -> Dict[torch.Tensor, torch.Tensor]:
    rpc.autograd.backward(context_id, [loss])
    return rpc.autograd.get_gradients(context_id)


class ScaleModule(torch.nn.Module):
    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def make_script_module(factor):
    return torch.jit.script(ScaleModule(factor))


# ---- upstream's private all-gather (torchrpc/all_gather.py) ----------------


def all_gather_of(obj, worker_names=None, timeout=10.0):
    return rpc.api._all_gather(obj, worker_names=worker_names, timeout=timeout)


def wait_all_workers_then(value, delay=0.0):
    time.sleep(delay)
    rpc.api._wait_all_workers(timeout=10.0)
    return value


def barrier_then(names, value):
    rpc.api._barrier(names)
    return value
