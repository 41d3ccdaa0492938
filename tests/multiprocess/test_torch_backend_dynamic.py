"""torch.distributed.rpc's TORCHRPC backend in a dynamic job (init_rpc
without a world_size, as TensorPipe allows): workers join a running job,
call and are called both ways, and leave one by one while the others go on.
Rank 0 runs as a subprocess (torch_backend_job.py)."""

import time

import pytest
import torch
import torch.distributed.rpc as rpc
from torch.testing import assert_close

from tests.multiprocess import torch_backend_funcs as F
from tests.multiprocess.torch_backend_job import TorchBackendJob


def _names():
    return sorted(w.name for w in rpc.api._get_current_rpc_agent().get_worker_infos())


def _until(condition, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s; the job has {_names()}"
        time.sleep(0.05)


def _dynamic_job_on_rank0():
    agent = rpc.api._get_current_rpc_agent()
    assert not agent.is_static_group
    _until(lambda: _names() == ["worker0", "worker1", "worker2"], "every worker joined")
    # Both ways, and a call from a worker that joined later back to this one.
    assert_close(rpc.rpc_sync("worker2", torch.add, args=(torch.ones(2), 1)), torch.full((2,), 2.0))
    assert_close(rpc.rpc_sync("worker1", F.nested_add, args=("worker2", torch.ones(2), 1)), torch.full((2,), 3.0))
    assert_close(rpc.rpc_sync("worker2", F.nested_add, args=("worker0", torch.ones(2), 2)), torch.full((2,), 4.0))
    # worker2 leaves alone, while a call to it is in flight; the others go on.
    slow = rpc.rpc_async("worker2", F.sleep_then, args=(0.5, 9))
    assert rpc.rpc_sync("worker2", F.request_stop) == "worker2"
    assert slow.wait() == 9  # it answered what it was serving before it left
    _until(lambda: "worker2" not in _names(), "worker2 left")
    with pytest.raises(RuntimeError, match="worker2 .rank 2. left the job"):
        rpc.rpc_sync("worker2", torch.add, args=(torch.ones(1), 1))
    assert_close(rpc.rpc_sync("worker1", F.add, args=(torch.ones(1), 5)), torch.full((1,), 6.0))
    rpc.rpc_sync("worker1", F.request_stop)
    _until(lambda: _names() == ["worker0"], "worker1 left")
    print("dynamic job: checked", flush=True)


def test_workers_join_call_both_ways_and_leave_one_by_one():
    with TorchBackendJob(3, dynamic=True, driver=f"{__name__}:_dynamic_job_on_rank0") as job:
        codes = job.wait_exits(timeout=90)
        logs = {rank: job.log(rank) for rank in range(3)}
    assert codes == {0: 0, 1: 0, 2: 0} and "dynamic job: checked" in logs[0], logs
