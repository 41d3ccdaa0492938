"""Per-connection limits (csrc/transport/connection.h): requests admitted
with tickets, messages over the cap refused, heartbeats that find a stopped
peer. One job whose options are small enough to reach every limit."""

import os
import signal
import threading
import time

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs, probes
from tests.multiprocess.cluster import Cluster

CALLS_IN_FLIGHT = 2
MESSAGE_BYTES = 4 << 20
HEARTBEAT = 2.0


@pytest.fixture(scope="module")
def job():
    options = dict(max_calls_in_flight=CALLS_IN_FLIGHT, max_message_bytes=MESSAGE_BYTES,
                   heartbeat_timeout=HEARTBEAT)
    with Cluster(3, threads=8, options=options) as c:
        yield c


def test_requests_beyond_the_cap_wait_their_turn_in_order(job):
    rpc.rpc_sync("worker1", funcs.most_running, args=(True,))
    futures = [rpc.rpc_async("worker1", funcs.sleep_counting, args=(0.3,)) for _ in range(6)]
    for f in futures:
        f.wait()
    # 8 pool threads, but only CALLS_IN_FLIGHT of this connection's requests ran at once.
    assert rpc.rpc_sync("worker1", funcs.most_running, args=(True,)) == CALLS_IN_FLIGHT


def test_parked_requests_do_not_stop_the_responses_their_callers_wait_for(job):
    # Each call makes a nested call back to worker0 and waits for it: worker1
    # must read those responses while requests beyond its cap are parked.
    futures = [rpc.rpc_async("worker1", funcs.call_back_and_sleep, args=("worker0", 0.05), timeout=20)
               for _ in range(3 * CALLS_IN_FLIGHT)]
    assert [f.wait() for f in futures] == [0.05] * len(futures)


def test_a_message_over_the_cap_fails_its_call_and_not_the_connection(job):
    with pytest.raises(ValueError, match="max_message_bytes"):
        rpc.rpc_sync("worker1", torch.add, args=(torch.ones(MESSAGE_BYTES // 4 + 1), 1))
    # A response over the cap: the callee answers with the error instead.
    with pytest.raises(ValueError, match="max_message_bytes"):
        rpc.rpc_sync("worker1", funcs.zeros, args=(MESSAGE_BYTES // 4 + 1,))
    assert rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1)).tolist() == [2.0, 2.0]


def test_a_stopped_peer_fails_a_call_without_timeout_within_the_heartbeat(job):
    pid = rpc.rpc_sync("worker2", os.getpid)
    result = {}

    def call():
        start = time.monotonic()
        try:
            rpc.rpc_sync("worker2", funcs.sleep, args=(0,), timeout=0)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            result["error"] = exc
        result["seconds"] = time.monotonic() - start

    probes.stop(pid)
    try:
        t = threading.Thread(target=call)
        t.start()
        t.join(timeout=HEARTBEAT * 5)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert not t.is_alive(), "a call to a stopped peer hung past the heartbeat"
    assert isinstance(result.get("error"), rpc.PeerUnreachableError), result
    assert "worker2" in str(result["error"]) and "heartbeat" in str(result["error"])
    assert result["seconds"] < HEARTBEAT * 3
    # Resumed, it serves again (on a new connection).
    assert rpc.rpc_sync("worker2", funcs.sleep, args=(0,)) == 0


def test_a_busy_peer_is_not_taken_for_a_stopped_one(job):
    # A call that runs three heartbeats long: the peer's I/O thread answers
    # the pings meanwhile.
    assert rpc.rpc_sync("worker1", funcs.sleep, args=(HEARTBEAT * 1.5,), timeout=0) == HEARTBEAT * 1.5
