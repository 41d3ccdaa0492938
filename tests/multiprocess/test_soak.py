"""Soak (issue #21, long mode, outside CI): 1M calls and 100k RRefs
against one worker. Memory stays flat after the warm-up, on both ends, and
no RRef is left alive at the end. Run it with TORCHRPC_SOAK=1 (minutes)."""

import gc
import os

import pytest

import torchrpc as rpc
from tests.multiprocess import funcs, probes
from tests.multiprocess.cluster import Cluster

pytestmark = pytest.mark.skipif(os.environ.get("TORCHRPC_SOAK") != "1",
                                reason="soak mode: set TORCHRPC_SOAK=1 to run 1M calls and 100k RRefs (minutes)")

CALLS = 1_000_000
RREFS = 100_000
IN_FLIGHT = 1000
WARM_UP = 50_000
# allowed growth after the warm-up: allocator noise, not a leak (1M calls
# leaking 64 bytes each would be 64 MB)
SLACK = 32 << 20


@pytest.fixture(scope="module")
def job():
    with Cluster(2) as c:
        yield c


def _rss_both(job):
    return probes.rss_bytes(os.getpid()), probes.rss_bytes(job.procs[1].pid)


def _assert_flat(before, after, what):
    for name, b, a in zip(("worker0", "worker1"), before, after):
        assert a - b < SLACK, f"{name}'s RSS grew by {(a - b) >> 20} MB over {what} after the warm-up"


def _calls(n):
    for start in range(0, n, IN_FLIGHT):
        futs = [rpc.rpc_async("worker1", funcs.no_tensors, args=(i,)) for i in range(start, start + IN_FLIGHT)]
        assert [f.wait() for f in futs] == [2 * i for i in range(start, start + IN_FLIGHT)]


def _rrefs(n):
    for start in range(0, n, IN_FLIGHT):
        rrefs = [rpc.remote("worker1", funcs.py_add, args=(i, 1)) for i in range(start, start + IN_FLIGHT)]
        assert rrefs[-1].to_here() == start + IN_FLIGHT
        del rrefs


def _settle():
    gc.collect()
    assert rpc.rref._wait_idle(30.0) == 0


@pytest.mark.timeout(3600)
def test_a_million_calls_keep_memory_flat(job):
    _calls(WARM_UP)
    before = _rss_both(job)
    _calls(CALLS - WARM_UP)
    _assert_flat(before, _rss_both(job), f"{CALLS} calls")
    assert rpc.api._debug_info()["pending_requests"] == 0


@pytest.mark.timeout(3600)
def test_a_hundred_thousand_rrefs_leave_none_alive(job):
    _rrefs(WARM_UP // 10)
    _settle()
    before = _rss_both(job)
    _rrefs(RREFS - WARM_UP // 10)
    _settle()
    _assert_flat(before, _rss_both(job), f"{RREFS} RRefs")
    mine, theirs = rpc.api._debug_info(), rpc.rpc_sync("worker1", funcs.debug_info)
    assert (mine["user_rrefs"], mine["owner_rrefs"], theirs["owner_rrefs"], theirs["user_rrefs"]) == (0, 0, 0, 0)
    assert (mine["rref_messages_in_flight"], theirs["rref_messages_in_flight"]) == (0, 0)
