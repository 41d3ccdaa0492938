"""torch.distributed.rpc's TORCHRPC backend when a worker dies: its pending
calls fail at once (not at their timeout) with an error naming it, and so
does a later call to it. Rank 0 runs as a subprocess (torch_backend_job.py:
upstream's init_rpc joins fresh peers once per process)."""

import time

import pytest
import torch
import torch.distributed.rpc as rpc

from tests.multiprocess import torch_backend_funcs as F
from tests.multiprocess.torch_backend_job import TorchBackendJob


def _dead_peer_on_rank0():
    pending = rpc.rpc_async("worker1", F.sleep_then, args=(30.0, 0))
    rpc.rpc_sync("worker1", F.exit_soon, args=(0.2,))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="worker1 may have exited"):
        pending.wait()
    assert time.monotonic() - start < 10  # the connection's loss, not the 60 s timeout
    with pytest.raises(RuntimeError, match="worker1"):
        rpc.rpc_sync("worker1", torch.add, args=(torch.ones(1), 1))
    print("dead peer: checked", flush=True)


def test_a_dead_peer_fails_its_pending_calls_at_once_naming_it():
    with TorchBackendJob(2, rpc_timeout=60.0, driver=f"{__name__}:_dead_peer_on_rank0") as job:
        codes = job.wait_exits()
        log = job.log(0)
    assert codes == {0: 0, 1: 7} and "dead peer: checked" in log, log
