"""From TorchScript to torch.export: one small remote model served both ways.

TorchScript is deprecated; ``torch.export`` with AOTInductor is its successor
for deployment. torchrpc serves both the same way: by a registered name, from
the callee's C++ pool, without the GIL. This program runs two workers:

- ``server`` (a child process) builds a small MLP and registers it twice:
  scripted (``torch.jit.script``) as ``"mlp.script"``, and exported
  (``torch.export.export``, with a dynamic batch dimension) as
  ``"mlp.export"``, which AOTInductor compiles into a package once, cached on
  disk;
- ``client`` (this process) calls both by name and times them, checks them
  against the same model run here, calls the ExportedProgram itself (the
  package is shipped to the server once, by hash), and shows the error an
  input outside the exported bounds gets.

Run it (from the repository root; the compile takes 10-30 s):

    .venv/bin/python tutorials/torchscript_to_export.py

What changes for the model's author: export takes example inputs and the
dimensions that may vary (``Dim``), where scripting needed type annotations;
an exported program must take tensors and return tensors; it runs for
inference only. What stays: callers name it the same way, from eager code or
from TorchScript, and the callee runs it without Python.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

import torchrpc as rpc
from torchrpc import exported

warnings.simplefilter("ignore")  # torch.jit deprecation notices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALLS = 500


class MLP(torch.nn.Module):
    """The remote model: 8 features in, 4 scores out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same weights in both processes
        self.hidden = torch.nn.Linear(8, 32)
        self.out = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def export(model):
    """The model as an ExportedProgram whose batch may be 1..1024 rows."""
    batch = torch.export.Dim("batch", min=1, max=1024)
    return torch.export.export(model, (torch.ones(2, 8),), dynamic_shapes={"x": {0: batch}})


def options(port):
    return rpc.RpcOptions(init_method=f"tcp://127.0.0.1:{port}")


def serve(port):
    model = MLP().eval()
    started = time.perf_counter()
    rpc.register("mlp.script", torch.jit.script(model))
    print(f"server: scripted the model in {time.perf_counter() - started:.2f} s, registered as 'mlp.script'",
          flush=True)
    started = time.perf_counter()
    ep = export(model)
    exported_s = time.perf_counter() - started
    started = time.perf_counter()
    rpc.register("mlp.export", ep)  # AOTInductor compiles it here, or finds it in the cache
    print(f"server: exported the model in {exported_s:.1f} s and compiled it with AOTInductor in "
          f"{time.perf_counter() - started:.1f} s, registered as 'mlp.export'", flush=True)
    rpc.init_rpc("server", rank=1, world_size=2, rpc_backend_options=options(port))
    rpc.shutdown()  # serves until the client is done


def first_ms(fn):
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def medians(calls, n, block=50):
    """Median µs of n calls of each of `calls` ({label: fn}), taken in
    alternating blocks so that all see the same phases of a busy machine."""
    samples = {label: [] for label in calls}
    for _ in range(n // block):
        for label, fn in calls.items():
            for _ in range(block):
                started = time.perf_counter()
                fn()
                samples[label].append((time.perf_counter() - started) * 1e6)
    return {label: statistics.median(v) for label, v in samples.items()}


def client(port):
    model = MLP().eval()
    x = torch.randn(16, 8)
    rpc.init_rpc("client", rank=0, world_size=2, rpc_backend_options=options(port))
    try:
        by_name = {name: (lambda n=name: rpc.rpc_sync("server", n, args=(x,))) for name in ("mlp.script", "mlp.export")}
        for name, call in by_name.items():
            print(f"client: {name:<10}  first call {first_ms(call):6.2f} ms")
        with torch.no_grad():
            local = model(x)
        same = all(torch.allclose(call(), local, atol=1e-5) for call in by_name.values())
        print(f"client: both agree with the model run here: {same}")
        assert same, "a served model disagrees with the local one"

        # The program itself, no name: this process finds the package in the
        # cache the server filled (same host, same folder) and ships it once.
        ep = export(model)
        started = time.perf_counter()
        path = exported.package(ep)
        hit_ms = (time.perf_counter() - started) * 1e3
        direct = lambda: rpc.rpc_sync("server", ep, args=(x,))  # noqa: E731
        print(f"client: the ExportedProgram itself: cache hit {hit_ms:.0f} ms, first call {first_ms(direct):.1f} ms "
              f"(ships the {os.path.getsize(path) / 2**20:.1f} MB package to the server)")

        took = medians({**by_name, "the program": direct}, CALLS)
        for label, median in took.items():
            print(f"client: {label:<11} median {median:5.0f} µs per call ({CALLS} calls, a batch of {x.shape[0]})")

        # Inputs are checked against the exported signature before anything runs.
        try:
            rpc.rpc_sync("server", "mlp.export", args=(torch.randn(2000, 8),))
        except TypeError as err:
            print(f"client: a batch of 2000 rows is refused: TypeError: {err}")
    finally:
        rpc.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)  # the server's port
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="torchrpc-aoti-") as cache:
        # A fresh package cache, shared by both processes (the default is
        # ~/.cache/torchrpc/aoti, where a second run would find the package).
        os.environ[exported.CACHE_ENV] = cache
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)],
                                  env=dict(os.environ, PYTHONPATH=ROOT))
        try:
            client(port)
            server.wait(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
    if server.returncode != 0:
        sys.exit("the server failed")
    print("client: done")


if __name__ == "__main__":
    main()
