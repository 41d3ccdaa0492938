"""Upstream's private ``rpc.api._all_gather`` and ``_wait_all_workers``
(torchrpc/all_gather.py), against a 3-worker job: every worker gets every
worker's object; a worker that does not come is named when the wait times out."""

import time

import pytest

import torchrpc as rpc
from tests.multiprocess import funcs
from tests.multiprocess.cluster import Cluster


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3) as c:
        yield c


def test_every_worker_gets_every_object():
    futs = [rpc.rpc_async(f"worker{r}", funcs.all_gather_of, args=({"rank": r},)) for r in (1, 2)]
    mine = rpc.api._all_gather({"rank": 0})
    expected = {f"worker{r}": {"rank": r} for r in range(3)}
    assert mine == expected
    assert [f.wait() for f in futs] == [expected, expected]


def test_calls_match_in_order_and_a_subset_gathers_alone():
    for round_ in range(3):
        fut = rpc.rpc_async("worker2", funcs.all_gather_of, args=(round_ * 10 + 2, ["worker0", "worker2"]))
        assert rpc.api._all_gather(round_ * 10, worker_names=["worker2", "worker0"]) == {
            "worker0": round_ * 10, "worker2": round_ * 10 + 2}
        assert fut.wait() == {"worker0": round_ * 10, "worker2": round_ * 10 + 2}


def test_wait_all_workers_waits_for_the_last_and_serves_meanwhile():
    late = rpc.rpc_async("worker1", funcs.wait_all_workers_then, args=("late", 0.5))
    early = rpc.rpc_async("worker2", funcs.wait_all_workers_then, args=("early",))
    start = time.monotonic()
    rpc.api._wait_all_workers()
    assert time.monotonic() - start >= 0.4  # worker1 came after its 0.5 s sleep
    assert rpc.rpc_sync("worker2", funcs.add, args=(funcs.torch.ones(1), funcs.torch.ones(1))).item() == 2
    assert (late.wait(), early.wait()) == ("late", "early")


def test_a_worker_that_never_comes_is_named():
    with pytest.raises(rpc.RpcTimeoutError, match=r"_all_gather .* on worker0 timed out .*\['worker1'\]"):
        rpc.api._all_gather(None, worker_names=["worker0", "worker1", "worker2"][:2], timeout=0.3)


def test_this_worker_must_be_among_the_names():
    with pytest.raises(ValueError, match="not among worker_names"):
        rpc.api._all_gather(None, worker_names=["worker1", "worker2"])


def test_barrier_of_a_subset():
    # (worker0 and worker1 may be out of step: test_a_worker_that_never_comes_is_named)
    fut = rpc.rpc_async("worker2", funcs.barrier_then, args=(["worker0", "worker2"], "done"))
    rpc.api._barrier(["worker2", "worker0"])
    assert fut.wait() == "done"
