"""A program whose remote functions live in its own __main__, as scripts
written for torch.distributed.rpc define them: every worker runs this file.
Rank 1 calls rank 0 and prints what it got (test_callables.py reads it)."""

import dataclasses
import json
import sys
import threading

import torch

import torchrpc as rpc


@dataclasses.dataclass
class Update:
    worker: str
    grad: torch.Tensor


counter = {"n": 0}
LOCK = threading.Lock()  # unpicklable: the function travels by name, as upstream sends it


def bump():
    with LOCK:
        counter["n"] += 1
        return counter["n"]


def is_update(u):
    return type(u) is Update


def own_counter():
    return sys.modules["__main__"].counter["n"]


def main(rank, init_method):
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2,
                 rpc_backend_options=rpc.RpcOptions(init_method=init_method, init_timeout=60, rpc_timeout=30))
    if rank == 1:
        seen = {
            "bumps": [rpc.rpc_sync("worker0", bump) for _ in range(3)],
            "callee_counter": rpc.rpc_sync("worker0", own_counter),
            "is_update": rpc.rpc_sync("worker0", is_update, args=(Update("worker1", torch.ones(1)),)),
        }
        print("RESULT " + json.dumps(seen), flush=True)
    rpc.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
