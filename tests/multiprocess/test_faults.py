"""Faults a user sees as a peer that dies or stops (issue #21, item 6):
SIGKILL of a callee mid-call, mid-backward, mid-RRef-fork and mid-shutdown,
and SIGSTOP of a callee while a call without a timeout waits on it. Every
failure must come promptly, as an error naming the peer, never as a hang.

The workers run with TORCHRPC_HEARTBEAT_SECONDS=2 (assumed name of the
heartbeat's setting): a connection with calls outstanding that receives
nothing for that long is closed with an error naming the peer and saying
it stopped responding."""

import gc
import subprocess
import threading
import time

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import fault_funcs, funcs, probes, rref_funcs
from tests.multiprocess.cluster import Cluster, _environment

HEARTBEAT = probes.HEARTBEAT_SECONDS
PROMPT = 3.0  # seconds within which a killed peer's calls must fail


@pytest.fixture(scope="module")
def job():
    # worker1 helps; workers 2-5 are killed or stopped, one per test
    with _environment({"TORCHRPC_HEARTBEAT_SECONDS": str(HEARTBEAT)}), Cluster(6) as c:
        yield c


@pytest.fixture(autouse=True)
def _no_pending_calls_left():
    yield
    assert rpc.api._debug_info()["pending_requests"] == 0


def test_sigkill_mid_shutdown_lets_the_survivors_finish_fast():
    """worker2 dies while worker0 and worker1 shut down gracefully: both
    finish in seconds (not their 10 s and 30 s graceful timeouts), and an error, if any,
    names worker2. First in the file: it needs this process out of the job
    of the other tests."""
    job = Cluster(3)
    with job.unmanaged():
        assert rpc.rpc_sync("worker2", funcs.pid) == job.procs[2].pid
        rpc.rpc_sync("worker1", funcs.stop_worker, args=(True,))  # worker1 starts its graceful shutdown
        job.kill(2)
        started, error = time.monotonic(), None
        try:
            rpc.shutdown(graceful=True, timeout=10)
        except rpc.RpcError as exc:
            error = exc
        took = time.monotonic() - started
        try:
            job.procs[1].wait(timeout=10)
            worker1_took = time.monotonic() - started
        except subprocess.TimeoutExpired:
            worker1_took = float("inf")
    assert took < 5, f"worker0's graceful shutdown took {took:.1f} s with worker2 dead"
    assert worker1_took < 5, f"worker1 exited {worker1_took:.1f} s after worker2 died:\n{job.log(1)[-2000:]}"
    assert error is None or "worker2" in str(error), error


def _fails_naming(fut, error, peer, within=PROMPT + 10):
    """Asserts fut fails with `error` naming `peer` within `within` seconds;
    returns the message. Never blocks longer: a C++ wait would not let
    pytest-timeout interrupt it."""
    deadline = time.monotonic() + within
    while not fut.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fut.done(), f"the call still waits {within:.0f} s later"
    with pytest.raises(error, match=peer) as info:
        fut.wait()
    return str(info.value)


def test_sigkill_mid_call_fails_every_kind_of_pending_call(job):
    counter = rpc.remote("worker2", funcs.Counter, args=(1,))
    assert counter.rpc_sync().bump(1) == 2
    direct = [rpc.rpc_async("worker2", funcs.sleep, args=(30,), timeout=0),
              rpc.rpc_async("worker2", funcs.busy, args=(50_000_000,))]
    nested = rpc.rpc_async("worker1", funcs.call, args=("worker2", funcs.sleep, (30,)))  # worker1 -> worker2
    pending_rref = rpc.remote("worker2", funcs.sleep, args=(30,))
    time.sleep(0.5)  # the calls have reached worker2
    job.kill(2)
    killed = time.monotonic()
    for fut in direct:
        _fails_naming(fut, rpc.PeerUnreachableError, "worker2")
    _fails_naming(nested, rpc.RpcError, "worker2")  # worker1 re-raises what it got
    # bounded waits: a hang fails as a timeout instead of blocking the test in C++
    with pytest.raises(rpc.PeerUnreachableError, match="worker2"):
        pending_rref.to_here(timeout=PROMPT + 10)
    with pytest.raises(rpc.PeerUnreachableError, match="worker2"):
        counter.rpc_sync(timeout=PROMPT + 10).bump(1)
    assert time.monotonic() - killed < PROMPT


def test_sigkill_mid_backward_fails_the_backward_naming_the_peer(job):
    x = torch.ones(4, requires_grad=True)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker3", fault_funcs.slow_backward_double, args=(x,))
        outcome = {}

        def run():
            try:
                rpc.autograd.backward(ctx, [y.sum()])
                outcome["error"] = None
            except Exception as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert rpc.rpc_sync("worker3", fault_funcs.backward_started), "worker3's backward did not start"
        job.kill(3)
        killed = time.monotonic()
        thread.join(PROMPT + 10)
        assert not thread.is_alive(), "backward() still waits for worker3, killed mid-backward"
        assert time.monotonic() - killed < PROMPT
    assert isinstance(outcome["error"], rpc.PeerUnreachableError) and "worker3" in str(outcome["error"]), outcome["error"]


def test_sigkill_mid_rref_fork_releases_the_owners_value(job):
    """We pass an RRef owned by worker1 to worker4 and worker4 dies before it
    confirmed the fork: the call fails naming worker4, and once we drop our
    RRef, worker1 frees the value (no fork of the dead worker keeps it)."""
    rref = rpc.remote("worker1", rref_funcs.Tracked, args=("forked", torch.ones(2)))
    assert rref.to_here().payload.sum() == 2
    pid = job.procs[4].pid
    probes.stop(pid)  # the fork is sent but never accepted (kill() alone only starts the stop)
    try:
        fut = rpc.rpc_async("worker4", rref_funcs.store_rref, args=("forked", rref))
        time.sleep(0.3)
    finally:
        job.kill(4)
    killed = time.monotonic()
    _fails_naming(fut, rpc.PeerUnreachableError, "worker4")
    assert time.monotonic() - killed < PROMPT
    del rref, fut  # the future keeps its arguments
    gc.collect()
    deadline = time.monotonic() + 10
    while rpc.rpc_sync("worker1", rref_funcs.tracked_alive, args=("forked",)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not rpc.rpc_sync("worker1", rref_funcs.tracked_alive, args=("forked",)), \
        "worker1 still holds the value of an RRef whose only other user died mid-fork"
    assert rpc.rpc_sync("worker1", funcs.debug_info)["owner_rrefs"] == 0


def test_sigstop_with_no_timeout_fails_within_the_heartbeat(job):
    pid = job.procs[5].pid
    assert rpc.rpc_sync("worker5", funcs.pid) == pid  # connected
    probes.stop(pid)
    try:
        started = time.monotonic()
        fut = rpc.rpc_async("worker5", funcs.pid, timeout=0)  # only the heartbeat can end it
        message = _fails_naming(fut, rpc.PeerUnreachableError, "worker5", within=probes.HEARTBEAT_BOUND + 5)
        took = time.monotonic() - started
    finally:
        job.kill(5)
    assert "stopped responding" in message, message
    assert HEARTBEAT * 0.9 < took < probes.HEARTBEAT_BOUND, f"failed after {took:.1f} s (heartbeat {HEARTBEAT} s)"


def test_a_long_call_to_a_live_peer_outlives_the_heartbeat(job):
    """A callee busy for 3 heartbeat periods is not 'stopped': its call completes."""
    assert rpc.rpc_sync("worker1", funcs.sleep, args=(3 * HEARTBEAT,), timeout=0) == 3 * HEARTBEAT
