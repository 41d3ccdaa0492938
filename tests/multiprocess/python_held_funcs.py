"""What the workers of test_python_held.py run: traffic that hands Python
objects back and forth (results Python keeps and drops, tensors whose
storage Python touched, RRefs of Python values, futures with callbacks,
TorchScript's own calls), and a probe that records every time a torchrpc
thread that must never wait for the GIL asks for it."""

import ctypes
import gc
import os
import subprocess
import sysconfig
import threading
from typing import Any

import torch

import torchrpc as rpc
from tests.multiprocess import funcs

# An LD_PRELOAD library that logs, to $TORCHRPC_TEST_GIL_LOG/<pid>.log, each
# time a thread that must never wait for the GIL asks for it (libpython is a
# shared library, so its entry points can be interposed), with the stack that
# asked: the I/O thread, the deadline sweeper, the timer threads (PeerWatch's
# grace periods, RRef expiries) and the pool's watchdog.
_PROBE_SOURCE = r"""
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void noteGil(const char* entry) {
  char name[16] = {0};
  pthread_getname_np(pthread_self(), name, sizeof name);
  const char* dir = getenv("TORCHRPC_TEST_GIL_LOG");
  static const char* const watched[] = {"rpc-io", "rpc-timeouts", "rpc-timers", "rpc-pool-watch"};
  int hit = 0;
  for (unsigned i = 0; i < sizeof watched / sizeof watched[0]; ++i) hit |= strcmp(name, watched[i]) == 0;
  if (!hit || dir == NULL) return;
  char path[512];
  snprintf(path, sizeof path, "%s/%d.log", dir, (int)getpid());
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  dprintf(fd, "==== %s on %s\n", entry, name);
  void* frames[32];
  backtrace_symbols_fd(frames, backtrace(frames, 32), fd);
  close(fd);
}

#define INTERPOSE(ret, fn, params, args)                         \
  extern "C" ret fn params {                                     \
    static ret (*real) params;                                   \
    if (!real) real = (ret (*) params)dlsym(RTLD_NEXT, #fn);     \
    noteGil(#fn);                                                \
    return real args;                                            \
  }

INTERPOSE(void, PyEval_AcquireThread, (void* t), (t))
INTERPOSE(void, PyEval_RestoreThread, (void* t), (t))
INTERPOSE(int, PyGILState_Ensure, (void), ())
"""


# The probe interposes libpython's entry points, which only a shared libpython allows.
PROBE_WORKS = bool(sysconfig.get_config_var("Py_ENABLE_SHARED"))


def build_probe(folder):
    """Compiles the probe into `folder`; returns its path."""
    source = os.path.join(folder, "gil_probe.cpp")
    library = os.path.join(folder, "gil_probe.so")
    with open(source, "w") as f:
        f.write(_PROBE_SOURCE)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", library, source, "-ldl"], check=True)
    return library


def probe_env(folder):
    """The environment that runs a worker under the probe, logging to `folder`."""
    return {"LD_PRELOAD": build_probe(folder), "TORCHRPC_TEST_GIL_LOG": folder}


def gil_takes():
    """What the probe logged for this process: one stack per time one of the
    watched threads asked for the GIL."""
    path = os.path.join(os.environ["TORCHRPC_TEST_GIL_LOG"], f"{os.getpid()}.log")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [block for block in f.read().split("==== ") if block]


def _pair(x):
    return x + 1, [x * 2, x]


def _touched(x):
    """The argument back, once Python gave its storage an object (as
    share_memory_() and DataLoaders do), on the callee."""
    x.untyped_storage()
    return x


@torch.jit.script
def _script_future(to: str, x: torch.Tensor) -> torch.jit.Future[Any]:
    """TorchScript's own rpc_async, its future handed to Python."""
    return rpc.rpc_async(to, "tests.add", args=(x, x))


@rpc.functions.async_execution
@torch.jit.script
def _created_later(back: str, iterations: int) -> torch.jit.Future[Any]:
    """A value that exists only once `back` answers: TorchScript's own
    rpc_async, whose answer the I/O thread takes in."""
    return rpc.rpc_async(back, "tests.busy", args=(iterations,))


def traffic(to, rounds=200):
    """Calls `to` in every way that gives Python the values (and then drops
    them), as a user's program does."""
    x = torch.ones(8)
    for _ in range(rounds):
        kept = rpc.rpc_sync(to, funcs.add, args=(x, x))  # script
        kept = rpc.rpc_sync(to, torch.add, args=(kept, 1))  # builtin
        kept = rpc.rpc_sync(to, _pair, args=(kept,))  # Python, a tuple of tensors
        del kept
        futures = [rpc.rpc_async(to, funcs.add, args=(x, x)) for _ in range(16)]
        futures += [rpc.rpc_async(to, _pair, args=(x,)) for _ in range(4)]
        futures[0].then(lambda f: f.value() + 1)
        torch.futures.wait_all(futures)
        for fut in futures[:8]:
            fut.wait()
        del futures
        if _ % 4 == 0:
            kept = funcs.script_calls_async(to, x)  # TorchScript waits; Python takes the result
            kept = _script_future(to, x).then(lambda fut: fut.value() + 1).wait()  # a Python callback
            kept = rpc.rpc_sync(to, _touched, args=(x,)).untyped_storage()  # received, touched on both sides
            late = rpc.rpc_async(to, funcs.sleep, args=(0.1,), timeout=0.01)  # failed by the deadline sweeper
            late.then(lambda fut: None)
            try:
                late.wait()
            except rpc.RpcTimeoutError:
                pass
            del kept, late
    big = torch.ones(1 << 19)  # 2 MB: lent to a peer on this host
    big.untyped_storage()  # a storage with a Python object, as share_memory_() and DataLoaders make
    for _ in range(8):
        rpc.rpc_sync(to, torch.add, args=(big, 1))
        rpc.rpc_sync(to, _touched, args=(big,)).untyped_storage()  # lent both ways, touched on both sides
    rref = rpc.remote(to, funcs.add, args=(x, x))
    rref.to_here()
    for _ in range(4):  # a pickled method call (a slice is no IValue) that waits on the owner for its value
        rref = rpc.remote(to, _created_later, args=(rpc.get_worker_info().name, 20000))
        assert torch.equal(rref.rpc_async().__getitem__(slice(0, 4)).wait(), torch.full((4,), 20000.0))
    del rref
    for _ in range(16):
        rpc.rpc_sync(to, funcs.echo, args=(rpc.RRef(torch.ones(4)),))  # our own RRef, released by `to`
    gc.collect()
    return rpc.rref._wait_idle(10.0)


def take_gil_as_io_thread():
    """Asks for the GIL once from a thread named rpc-io; returns how many
    times the probe logged that."""
    before = len(gil_takes())

    def run():
        libc = ctypes.CDLL(None)
        libc.pthread_self.restype = ctypes.c_ulong
        libc.pthread_setname_np(ctypes.c_ulong(libc.pthread_self()), b"rpc-io")
        ctypes.pythonapi.PyGILState_Ensure.restype = ctypes.c_int
        ctypes.pythonapi.PyGILState_Release(ctypes.pythonapi.PyGILState_Ensure())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return len(gil_takes()) - before
