"""torchrpc in one page: three workers, three kinds of remote call.

Run it with ``make demo`` (or ``.venv/bin/python tutorials/demo.py``).

The script starts itself three times, as workers ``worker0``, ``worker1`` and
``worker2`` on this machine. worker0 calls the other two with each kind of
callee torchrpc knows:

1. a ``@torch.jit.script`` function: runs on the callee in C++, without the GIL;
2. a builtin operator such as ``torch.add``: also without the GIL;
3. any other Python callable (a function, even a lambda): pickled with
   cloudpickle, run under the callee's GIL.

Then it times 200 calls of each kind, and does the same with
``torch.distributed.rpc`` (TensorPipe) for comparison. Switching a program
between the two is one line: ``import torchrpc as rpc`` instead of
``import torch.distributed.rpc as rpc``.
"""

import argparse
import importlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

warnings.simplefilter("ignore")  # keep the tour's output readable (torch.jit.script is deprecated in 2.13)

WORLD_SIZE = 3
CALLS_TO_TIME = 200


# ---- The remote functions ----------------------------------------------------
# Every worker runs this file, so every worker defines the same functions.

@torch.jit.script
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """TorchScript: the callee runs it in its C++ thread pool, GIL-free."""
    return x * factor


def describe(t):
    """Plain Python: pickled by the caller, run under the callee's GIL."""
    return f"a tensor of shape {tuple(t.shape)} summing to {t.sum().item():g}"


#: The three kinds of call timed on both libraries: label -> (function, args).
TIMED_CALLS = {
    "TorchScript function": (scale, (torch.ones(3), 2.0)),
    "builtin torch.add": (torch.add, (torch.ones(3), 1)),
    "Python function": (describe, (torch.ones(3),)),
}


# ---- What worker0 does -------------------------------------------------------

def tour(rpc):
    """Shows each kind of call once, and an rpc_async to both workers at once."""
    x = torch.ones(3)
    print("worker0 calls the other workers:\n")
    show("rpc_sync('worker1', scale, args=(x, 2.0))", "TorchScript, no GIL on worker1",
         rpc.rpc_sync("worker1", scale, args=(x, 2.0)))
    show("rpc_sync('worker2', torch.add, args=(x, 1))", "builtin op, no GIL on worker2",
         rpc.rpc_sync("worker2", torch.add, args=(x, 1)))
    show("rpc_sync('worker1', describe, args=(x,))", "Python function, cloudpickled",
         rpc.rpc_sync("worker1", describe, args=(x,)))
    show("rpc_sync('worker2', lambda t: t.max(), args=(x * 7,))", "even a lambda",
         rpc.rpc_sync("worker2", lambda t: t.max(), args=(x * 7,)))
    futures = [rpc.rpc_async(f"worker{r}", scale, args=(x, float(r))) for r in (1, 2)]
    show("rpc_async to worker1 and worker2, then wait", "two calls in flight",
         [f.wait() for f in futures])
    print()


def show(call, kind, result):
    print(f"  {call}\n      {kind:<32} -> {result!r}")


def median_latency_us(rpc, fn, args, n=CALLS_TO_TIME):
    """Median round trip of n rpc_sync calls to worker1, in µs (after a warm-up)."""
    for _ in range(20):
        rpc.rpc_sync("worker1", fn, args=args)
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        rpc.rpc_sync("worker1", fn, args=args)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def worker(library, rank, port, out):
    """One worker process: join the job; worker0 does the calls; leave."""
    rpc = importlib.import_module(library)
    options_class = rpc.RpcOptions if library == "torchrpc" else rpc.TensorPipeRpcBackendOptions
    options = options_class(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=20)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=WORLD_SIZE, rpc_backend_options=options)
    if rank == 0:
        if library == "torchrpc":
            tour(rpc)
        latencies = {label: median_latency_us(rpc, fn, args) for label, (fn, args) in TIMED_CALLS.items()}
        with open(out, "w") as f:
            json.dump(latencies, f)
    rpc.shutdown()  # waits until every worker got here


# ---- Starting the workers ----------------------------------------------------

def run_job(library, timeout=60):
    """Starts 3 workers of `library`; returns worker0's latencies (µs by call)."""
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "latencies.json")
        log = open(os.path.join(tmp, "workers.log"), "w+")
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", library, str(rank), str(port), out],
                                  stdout=None if rank == 0 else log, stderr=log)
                 for rank in range(WORLD_SIZE)]
        try:
            deadline = time.monotonic() + timeout
            for p in procs:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            if any(p.returncode for p in procs):
                raise RuntimeError("a worker failed")
            with open(out) as f:
                return json.load(f)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as err:
            log.seek(0)
            sys.exit(f"{library} workers failed ({err}); their output:\n{log.read()[-3000:]}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)
            log.close()


def main():
    parser = argparse.ArgumentParser(description="torchrpc demo: three workers, three kinds of call")
    parser.add_argument("--worker", nargs=4, metavar=("LIBRARY", "RANK", "PORT", "OUT"),
                        help=argparse.SUPPRESS)  # how the demo starts its own workers
    args = parser.parse_args()
    if args.worker:
        library, rank, port, out = args.worker
        worker(library, int(rank), int(port), out)
        return

    print("Starting 3 torchrpc workers (worker0, worker1, worker2) on this machine...\n")
    ours = run_job("torchrpc")
    print(f"Timing {CALLS_TO_TIME} calls of each kind with torch.distributed.rpc too...\n")
    theirs = run_job("torch.distributed.rpc")

    print(f"Median rpc_sync round trip, worker0 -> worker1 ({CALLS_TO_TIME} calls each, this machine, now):\n")
    print(f"  {'call':<22} {'torch.distributed.rpc':>22} {'torchrpc':>10} {'speed-up':>9}")
    for label in TIMED_CALLS:
        print(f"  {label:<22} {theirs[label]:>19.0f} µs {ours[label]:>7.0f} µs {theirs[label] / ours[label]:>8.1f}x")
    print("\nNext: benchmarks/run_all.py (make bench) for throughput, big tensors, "
          "several callers, idle CPU and init time.")


if __name__ == "__main__":
    main()
