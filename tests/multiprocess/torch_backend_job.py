"""A job on torch.distributed.rpc's TORCHRPC backend for tests: this pytest
process is rank 0 and calls upstream's init_rpc itself; the other ranks are
subprocesses that join the same way (run as ``python -m
tests.multiprocess.torch_backend_job``), serve until rank 0 shuts down, and
shut down gracefully.

Upstream's init_rpc works once per process with fresh peers (its store
prefix counts the process's inits), so a second job in one test session
runs rank 0 as a subprocess too: ``driver="module:function"`` runs that
function there after init, then shuts down at once (unless the function
did, e.g. gracefully)."""

import argparse
import faulthandler
import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import torch.distributed.rpc as rpc

import torchrpc  # noqa: F401  (registers the backend)
from tests.multiprocess import cluster, worker


def _options(init_method, threads, rpc_timeout):
    return rpc.backend_registry.construct_rpc_backend_options(
        rpc.BackendType.TORCHRPC, init_method=init_method, num_worker_threads=threads, rpc_timeout=rpc_timeout)


class TorchBackendJob:
    """World of `world_size` workers worker0..N-1 on the TORCHRPC backend.
    With dynamic=True they call init_rpc without a world_size, and each
    worker but rank 0 serves until F.request_stop, then leaves on its own."""

    def __init__(self, world_size, *, threads=4, rpc_timeout=30.0, driver=None, dynamic=False,
                 init_method=None, prefix=None):
        self.world_size, self.threads, self.rpc_timeout, self.driver = world_size, threads, rpc_timeout, driver
        self.dynamic = dynamic
        self.init_method = init_method or f"tcp://127.0.0.1:{cluster.free_port()}"
        self.prefix = prefix or (lambda rank: [])  # what runs a rank's command (e.g. ip netns exec)
        self.dir = tempfile.mkdtemp(prefix="torchrpc-backend-")
        self.procs = {}
        self._final_logs = None  # the logs, once __exit__ removed the folder

    def log(self, rank):
        if self._final_logs is not None:
            return self._final_logs.get(rank, "")
        with open(os.path.join(self.dir, f"worker{rank}.log"), errors="backslashreplace") as f:  # upstream logs raw bytes
            return f.read()

    def __enter__(self):
        for rank in range(0 if self.driver else 1, self.world_size):
            cmd = [sys.executable, "-m", "tests.multiprocess.torch_backend_job", "--rank", str(rank),
                   "--world-size", str(0 if self.dynamic else self.world_size), "--init-method", self.init_method,
                   "--threads", str(self.threads), "--rpc-timeout", str(self.rpc_timeout)]
            if rank == 0:
                cmd += ["--driver", self.driver]
            self.procs[rank] = cluster.spawn([*self.prefix(rank), *cmd], os.path.join(self.dir, f"worker{rank}.log"))
        cluster._live.add(self)
        if self.driver:
            return self
        try:
            rpc.init_rpc("worker0", rank=0, world_size=self.world_size, backend=rpc.BackendType.TORCHRPC,
                         rpc_backend_options=_options(self.init_method, self.threads, self.rpc_timeout))
        except BaseException:
            self.kill_all()
            raise
        return self

    def __exit__(self, *exc):
        cluster._live.discard(self)
        self.kill_all()
        # The folder goes (as a cluster's does); log() still answers from what the logs held.
        self._final_logs = {rank: self.log(rank) for rank in self.procs
                            if os.path.exists(os.path.join(self.dir, f"worker{rank}.log"))}
        shutil.rmtree(self.dir, ignore_errors=True)

    def kill_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    def wait_exits(self, timeout=30):
        """{rank: exit code} of every worker process, after at most `timeout` s each."""
        codes = {}
        for rank, proc in self.procs.items():
            try:
                codes[rank] = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.dump_stacks()
                codes[rank] = "hung"
        return codes

    def dump_stacks(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGUSR1)
        for rank in self.procs:
            sys.stderr.write(f"\n===== worker{rank} log =====\n{self.log(rank)[-20000:]}")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rpc-timeout", type=float, default=30.0)
    parser.add_argument("--driver", help="module:function to run after init (rank 0)")
    args = parser.parse_args()
    worker._die_with_parent()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from tests.multiprocess import torch_backend_funcs  # noqa: F401  (its script functions, compiled here too)

    rpc.init_rpc(f"worker{args.rank}", rank=args.rank, world_size=args.world_size or None,
                 backend=rpc.BackendType.TORCHRPC,
                 rpc_backend_options=_options(args.init_method, args.threads, args.rpc_timeout))
    if args.driver:
        module, function = args.driver.split(":")
        try:
            getattr(importlib.import_module(module), function)()
        finally:
            if rpc.api._is_current_rpc_agent_set():  # unless the driver shut down itself
                rpc.shutdown(graceful=False)
        return
    if not args.world_size:  # a dynamic job's worker leaves when told, on its own
        assert torch_backend_funcs.wait_for_stop(120), "nobody called request_stop within 120 s"
    rpc.shutdown()  # graceful: a static job's serves until every worker got here


if __name__ == "__main__":
    main()
