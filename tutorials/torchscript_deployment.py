"""TorchScript deployment: a model that calls remote shards, saved once and
served by a C++ program with no Python in it.

The job has four workers on this machine:

- ``shard1`` and ``shard2`` (Python) each hold half of an embedding table and
  serve it as a scripted module registered under the name ``"shard.lookup"``;
- ``server`` is ``tutorials/cpp_worker`` (C++, links libtorchrpc, no Python):
  it loads the saved model and serves its forward as ``"server.forward"``;
- ``client`` (this process) scripts and saves the model, then calls the server.

The model's forward asks both shards for their embeddings through
``torchrpc.rpc_async`` inside TorchScript, so the same code runs scripted in
Python, and in the C++ server after ``torch.jit.load``.

Run it (from the repository root; builds the C++ worker the first time):

    .venv/bin/python tutorials/torchscript_deployment.py
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from typing import List

import torch

import torchrpc as rpc

warnings.simplefilter("ignore")  # torch.jit deprecation notices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS_PER_SHARD, DIM = 50, 4


class Shard(torch.nn.Module):
    """Rows [first, first + ROWS_PER_SHARD) of the table; zeros elsewhere."""

    def __init__(self, first: int):
        super().__init__()
        self.first = first
        self.rows = ROWS_PER_SHARD
        self.table = torch.nn.Parameter(torch.randn(ROWS_PER_SHARD, DIM, generator=torch.Generator().manual_seed(first)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.first
        mine = (local >= 0) & (local < self.rows)
        rows = self.table[local.clamp(0, self.rows - 1)]
        return rows * mine.unsqueeze(1).to(rows.dtype)


class ShardedModel(torch.nn.Module):
    """Embeds ids by asking every shard (in parallel), then scores them."""

    def __init__(self, shards: List[str]):
        super().__init__()
        self.shards = shards
        self.dim = DIM
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        futs = [rpc.rpc_async(s, "shard.lookup", args=(ids,)) for s in self.shards]
        embedding = torch.zeros(ids.size(0), self.dim)
        for fut in futs:
            part = fut.wait()
            assert isinstance(part, torch.Tensor)
            embedding = embedding + part
        return self.head(embedding).squeeze(1)


def options(port):
    return rpc.RpcOptions(init_method=f"tcp://127.0.0.1:{port}")


def run_shard(rank, port):
    rpc.register("shard.lookup", torch.jit.script(Shard(first=(rank - 1) * ROWS_PER_SHARD)))
    rpc.init_rpc(f"shard{rank}", rank=rank, world_size=4, rpc_backend_options=options(port))
    rpc.shutdown()  # serves until everyone is done


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        return run_shard(args.rank, args.port)

    sys.path.insert(0, ROOT)
    from tutorials.cpp_worker import build

    print("client: building the C++ worker (once) ...", flush=True)
    binary = build.build()

    torch.manual_seed(0)
    model = torch.jit.script(ShardedModel(["shard1", "shard2"]))
    folder = tempfile.mkdtemp(prefix="torchrpc-deploy-")
    path = os.path.join(folder, "sharded_model.pt")
    model.save(path)
    print(f"client: scripted and saved the model to {path}", flush=True)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port)], env=env)
             for r in (1, 2)]
    procs.append(subprocess.Popen([binary, "server", "3", "4", "127.0.0.1", str(port), path]))
    try:
        rpc.init_rpc("client", rank=0, world_size=4, rpc_backend_options=options(port))
        ids = torch.tensor([0, 7, 49, 50, 63, 99])
        took = []
        for _ in range(20):
            started = time.perf_counter()
            served = rpc.rpc_sync("server", "server.forward", args=(ids,))
            took.append((time.perf_counter() - started) * 1e3)
        local = model(ids)  # the same scripted code, run here
        print(f"client: server.forward({ids.tolist()}) = {[round(v, 3) for v in served.tolist()]}")
        print(f"client: first call {took[0]:.1f} ms (TorchScript warms up), then median "
              f"{sorted(took[1:])[len(took) // 2]:.2f} ms for client -> C++ server -> 2 Python shards -> back")
        print(f"client: the same model run here gives {[round(v, 3) for v in local.tolist()]}")
        assert torch.allclose(served, local), "the C++ server and the local model disagree"
        rpc.shutdown()
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(folder, ignore_errors=True)
    if any(p.returncode != 0 for p in procs):
        sys.exit("a worker failed")
    print("client: done")


if __name__ == "__main__":
    main()
