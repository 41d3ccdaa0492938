"""State that peers make on a worker is bounded and dies with them (issue
#21, items 2 and 4): requests naming RRefs that do not exist hold no pool
thread and make at most a capped number of owner entries; a worker that is
killed has the RRef forks it held released on their owners, and does not
hold up the others' graceful shutdown.

The tests run in file order against one job whose worker2 the third test
kills (the later ones kill it themselves when run alone); the last one
shuts the job down itself."""

import shutil
import socket
import tempfile
import time

import pytest

import torchrpc as rpc
from tests.multiprocess import autograd_funcs, funcs, python_held_funcs, raw_peer, rref_funcs
from tests.multiprocess.cluster import Cluster

SECRET = b"test-peer-death-job-secret"
GRACE_SECONDS = 0.5  # worker1's grace period for a lost peer (TORCHRPC_PEER_GRACE_SECONDS)
AWAITED_CAP = 4096  # csrc/rref/owner_table.h kMaxAwaitedPerPeer


@pytest.fixture(scope="module")
def job():
    # worker1 admits more requests than the RRef cap, which the test reaches,
    # and runs with the GIL probe (python_held_funcs): its timer thread ends
    # the grace period and frees what the killed worker held.
    folder = tempfile.mkdtemp(prefix="torchrpc-gil-probe-")
    env = {"TORCHRPC_PEER_GRACE_SECONDS": str(GRACE_SECONDS), **python_held_funcs.probe_env(folder)}
    cluster = Cluster(3, threads=4, secret=SECRET, worker_env={1: env},
                      worker_options={1: {"max_calls_in_flight": 2 * AWAITED_CAP}})
    try:
        with cluster.unmanaged() as c:
            yield c
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _worker1_tcp_address():
    tcp, _unix = rpc.rpc_sync("worker1", funcs.debug_info)["addresses"]
    host, port = tcp.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


def _wait_until(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds} s"
        time.sleep(0.05)


def _kill_worker2(job):
    """Kills worker2 (if the earlier test did not) after this process talked
    to it: a worker learns of a death from a connection it loses."""
    if 2 in job.alive():
        rpc.rpc_sync("worker2", funcs.no_tensors, args=(1,))
        job.kill(2)


def test_method_calls_on_missing_rrefs_hold_no_pool_thread(job):
    # Twice as many calls as worker1 has pool threads, for RRefs nobody created
    # (they may still be in flight from a third worker, so each waits for it).
    calls = 2 * job.threads
    with raw_peer.connect(_worker1_tcp_address(), SECRET, rank=0) as s:
        s.sendall(b"".join(raw_peer.frame(raw_peer.RREF_METHOD_CALL, 1 + i,
                                          raw_peer.method_call_payload(9, 1000 + i, "get"))
                           for i in range(calls)))
        # they were parsed and wait: each made an owner entry
        _wait_until(lambda: rpc.rpc_sync("worker1", rref_funcs.owner_entries, args=("9:",)) == calls, 10,
                    "worker1 taking the method calls")
        started = time.monotonic()
        assert rpc.rpc_sync("worker1", funcs.no_tensors, args=(3,), timeout=10) == 6
        assert time.monotonic() - started < 2.0, "a legitimate call waited for a pool thread"


def test_pickled_method_calls_on_a_value_being_created_hold_no_pool_thread(job):
    slow = rpc.remote("worker1", rref_funcs.Slow, args=(2.0,))
    # frozenset is no plain argument: these go pickled, and run on the owner
    # as Python calls that find the value not created yet
    futs = [slow.rpc_async(timeout=10).echo(frozenset({i})) for i in range(2 * job.threads)]
    started = time.monotonic()
    assert rpc.rpc_sync("worker1", funcs.no_tensors, args=(3,), timeout=10) == 6
    assert time.monotonic() - started < 1.0, "a legitimate call waited for the value's creation"
    assert [f.wait() for f in futs] == [frozenset({i}) for i in range(2 * job.threads)]


def test_what_a_killed_worker_held_is_released_on_the_others(job):
    rpc.rpc_sync("worker2", rref_funcs.remote_and_keep, args=("held", "worker1", "held-by-worker2"))
    assert rpc.rpc_sync("worker1", rref_funcs.tracked_alive, args=("held-by-worker2",))
    context_id = rpc.rpc_sync("worker2", autograd_funcs.hold_context_with_call, args=("worker1",))
    assert context_id in rpc.rpc_sync("worker1", autograd_funcs.live_contexts)
    job.kill(2)
    killed = time.monotonic()
    _wait_until(lambda: not rpc.rpc_sync("worker1", rref_funcs.tracked_alive, args=("held-by-worker2",)), 10,
                "worker1 freeing the value only the killed worker2 held")
    assert time.monotonic() - killed >= GRACE_SECONDS * 0.9, "released before the grace period ended"
    assert rpc.rpc_sync("worker1", rref_funcs.owner_entries, args=("2:",)) == 0
    _wait_until(lambda: context_id not in rpc.rpc_sync("worker1", autograd_funcs.live_contexts), 5,
                "worker1 releasing the autograd context of the killed worker2")
    if python_held_funcs.PROBE_WORKS:
        # The value was a Python object: freeing it takes the GIL, which the
        # timer thread (it serves every peer's grace period) must not wait for.
        takes = rpc.rpc_sync("worker1", python_held_funcs.gil_takes)
        assert not takes, f"worker1 took the GIL where it must not; the first time:\n{takes[0]}"


def test_fetches_of_missing_rrefs_are_capped_and_dropped_with_their_peer(job):
    _kill_worker2(job)
    extra = 50
    # A member of the job (worker2's rank, whose process is dead) asks for
    # more RRefs that do not exist than the cap allows.
    with raw_peer.connect(_worker1_tcp_address(), SECRET, rank=2) as s:
        s.sendall(b"".join(raw_peer.frame(raw_peer.RREF_FETCH, 1 + i, raw_peer.rref_id(7, 1000 + i))
                           for i in range(AWAITED_CAP + extra)))
        # the ones past the cap are answered at once with an error naming it
        s.settimeout(10)
        answers = b""
        while b"cap is %d" % AWAITED_CAP not in answers:
            chunk = s.recv(1 << 16)
            assert chunk, "worker1 closed the connection instead of answering"
            answers += chunk
        _wait_until(lambda: rpc.rpc_sync("worker1", rref_funcs.owner_entries, args=("7:",)) == AWAITED_CAP, 10,
                    "worker1 taking the fetches")
        s.shutdown(socket.SHUT_RDWR)  # gone without GOODBYE
    _wait_until(lambda: rpc.rpc_sync("worker1", rref_funcs.owner_entries, args=("7:",)) == 0, 10,
                "worker1 dropping the entries of the peer that left")
    assert rpc.rpc_sync("worker1", funcs.no_tensors, args=(1,)) == 2


def test_graceful_shutdown_does_not_wait_for_a_killed_worker(job):
    _kill_worker2(job)
    rpc.rpc_sync("worker1", funcs.stop_worker, args=(True,))
    started = time.monotonic()
    with pytest.raises(rpc.PeerUnreachableError, match=r"worker2 \(rank 2") as info:
        rpc.shutdown(graceful=True, timeout=20)
    elapsed = time.monotonic() - started
    assert "died without shutting down" in str(info.value)
    assert elapsed < 1.5, f"shutdown took {elapsed:.2f} s with a dead peer"
    job.procs[1].wait(timeout=10)
    assert "died without shutting down" in job.log(1)
