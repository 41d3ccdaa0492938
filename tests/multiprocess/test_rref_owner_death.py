"""An RRef whose owner is killed: to_here() and the proxies fail promptly
with PeerUnreachableError naming the owner, on every user."""

import time

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs, rref_funcs
from tests.multiprocess.cluster import Cluster


@pytest.fixture(scope="module")
def job():
    with Cluster(3) as c:
        yield c


def test_to_here_of_a_dead_owner_fails_promptly(job):
    rref = rpc.remote("worker2", rref_funcs.Tracked, args=("doomed", torch.ones(2)))
    assert torch.equal(rref.rpc_sync().get(), torch.ones(2))
    assert rpc.rpc_sync("worker1", rref_funcs.store_rref, args=("doomed", rref)) is False
    job.kill(2)
    start = time.monotonic()
    with pytest.raises(rpc.PeerUnreachableError, match="worker2"):
        rref.to_here(timeout=60)
    with pytest.raises(rpc.PeerUnreachableError, match="worker2"):
        rref.rpc_sync(timeout=60).get()
    kind, message = rpc.rpc_sync("worker1", rref_funcs.rref_to_here_error, args=(rref, 60))
    assert kind == "PeerUnreachableError" and "worker2" in message
    assert time.monotonic() - start < 30  # not the 60 s timeout
    # remote() to the dead worker: the RRef reports it on to_here
    late = rpc.remote("worker2", funcs.py_add, args=(1, 2))
    with pytest.raises(rpc.PeerUnreachableError, match="worker2"):
        late.to_here(timeout=60)
    rpc.rpc_sync("worker1", rref_funcs.drop_stored)
