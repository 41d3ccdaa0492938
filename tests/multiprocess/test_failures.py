"""Failures a user must be able to act on: a worker that dies, and a peer
that sends garbage after the handshake (a member of the job: raw_peer). The
job has spare workers that tests kill on purpose."""

import struct
import time

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs, probes, raw_peer
from tests.multiprocess.cluster import Cluster

MAGIC = raw_peer.FRAME_MAGIC
HELLO = 1
LEND_RELEASE = 7  # transport/same_host.h: the connection's own frame


SECRET = b"test-failures-job-secret"


@pytest.fixture(scope="module")
def job():
    with Cluster(4, secret=SECRET) as c:
        yield c


def test_killed_callee_fails_every_pending_call_at_once(job):
    rpc.rpc_sync("worker3", funcs.busy, args=(1,))  # resolve the script function
    futs = [
        rpc.rpc_async("worker3", funcs.sleep, args=(30,)),
        rpc.rpc_async("worker3", funcs.busy, args=(10_000_000,)),
        rpc.rpc_async("worker3", funcs.sleep, args=(20,), timeout=0),  # no deadline at all
    ]
    time.sleep(0.5)
    job.kill(3)
    killed = time.monotonic()
    for fut in futs:
        with pytest.raises(rpc.PeerUnreachableError, match="worker3") as info:
            fut.wait()
        assert isinstance(info.value, ConnectionError) and isinstance(info.value, RuntimeError)
    assert time.monotonic() - killed < 1.0, "pending calls waited for their timeout"
    # and later calls fail at once too, naming the worker
    started = time.monotonic()
    with pytest.raises(rpc.PeerUnreachableError, match="worker3"):
        rpc.rpc_sync("worker3", funcs.pid, timeout=20)
    assert time.monotonic() - started < 5.0


def test_killed_peer_fails_calls_between_other_workers(job):
    fut = rpc.rpc_async("worker1", funcs.call_expect_error, args=("worker2", funcs.sleep, (30,)))
    time.sleep(0.5)
    job.kill(2)
    kind, message = fut.wait()
    assert kind == "PeerUnreachableError" and "worker2" in message and "sleep" in message
    # the other workers are unaffected
    assert rpc.rpc_sync("worker1", funcs.no_tensors, args=(4,)) == 8


def _worker1_tcp_address():
    tcp, _unix = rpc.rpc_sync("worker1", funcs.debug_info)["addresses"]
    host, port = tcp.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


def _header(type_, payload_len, num_tensors=0, desc_len=0, magic=MAGIC, version=raw_peer.WIRE_VERSION):
    return struct.pack("<IHHQQII", magic, version, type_, 0, payload_len, num_tensors, desc_len)


@pytest.mark.parametrize("garbage, reason", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 16, "magic"),
    (_header(HELLO, 1 << 62), "payload"),
    (_header(HELLO, 8, num_tensors=1 << 30), "tensor"),
    (_header(999, 0), "type"),
    (_header(LEND_RELEASE, 3) + b"abc", "lend_release"),
], ids=["not-torchrpc", "huge-payload", "too-many-tensors", "unknown-type", "bad-lend-release"])
def test_malformed_frame_closes_only_that_connection(job, garbage, reason):
    before = job.log(1).count("malformed frame")
    with raw_peer.connect(_worker1_tcp_address(), SECRET, rank=0) as s:
        s.sendall(garbage)
        s.settimeout(10)
        assert s.recv(1) == b"", "worker1 kept a connection that sent a malformed frame open"
    # worker1 logged why, and still serves everyone
    deadline = time.monotonic() + 5
    while job.log(1).count("malformed frame") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [line for line in job.log(1).splitlines() if "malformed frame" in line]
    assert len(lines) > before and reason in lines[-1].lower(), lines[-1:]
    assert torch.equal(rpc.rpc_sync("worker1", funcs.add, args=(torch.ones(1), torch.ones(1))),
                       torch.full((1,), 2.0))


def test_truncated_frame_closes_only_that_connection(job):
    with raw_peer.connect(_worker1_tcp_address(), SECRET, rank=0) as s:
        s.sendall(_header(HELLO, 100) + b"x" * 10)  # then the peer goes away mid-frame
    deadline = time.monotonic() + 5
    while "truncated frame" not in job.log(1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "truncated frame" in job.log(1)
    assert rpc.rpc_sync("worker1", funcs.no_tensors, args=(1,)) == 2


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_slow_reader_makes_the_sender_wait(job):
    """While worker1 reads nothing (stopped), a sender of much more than the
    per-connection queue limit (64 MB) blocks instead of queueing it all."""
    import os
    import signal
    import threading

    chunk = torch.ones(16 << 20, dtype=torch.uint8)  # 16 MB
    pid = job.procs[1].pid
    probes.stop(pid)
    resume = threading.Timer(1.5, os.kill, args=(pid, signal.SIGCONT))
    try:
        resume.start()
        rss_before = _rss_bytes()
        started = time.monotonic()
        futs = [rpc.rpc_async("worker1", funcs.checksum, args=(chunk,), timeout=30) for _ in range(16)]
        issued = time.monotonic() - started
        grew = _rss_bytes() - rss_before
    finally:
        resume.join()
        os.kill(pid, signal.SIGCONT)
    assert issued >= 1.0, f"256 MB were queued in {issued:.2f} s while the reader was stopped"
    assert grew < (128 << 20), f"the sender's memory grew by {grew >> 20} MB"
    assert [f.wait() for f in futs] == [16 << 20] * 16


PYTHON_CALL, EXCEPTION = 12, 29  # message/message_type.h


def _plain_call_error(payload):
    """The EXCEPTION text worker1 answers a raw PYTHON_CALL with; it then still serves."""
    from tests.csrc import hooks

    with raw_peer.connect(_worker1_tcp_address(), SECRET, rank=0) as s:
        s.settimeout(10)
        s.sendall(raw_peer.frame(PYTHON_CALL, 5, payload))
        type_, request_id, answer = raw_peer.read_frame(s)
    assert (type_, request_id) == (EXCEPTION, 5)
    assert rpc.rpc_sync("worker1", funcs.py_add, args=(1, 2)) == 3
    return hooks().decode_payload(answer, [])[0][1]


@pytest.mark.parametrize("call, type, why", [
    (("digest", "f"), "", "expected (digest: str, name: str, args: tuple"),
    (("digest", "f", [1], {}), "Tuple[str, str, List[int], Dict[str, Any]]", "got Tuple[str, str, List[int]"),
    (("digest", "f", (), {1: 2}), "", "kwargs: Dict[str, Any]), got"),
    (("digest", "f", (1,), {"k": 1}), "", "is not cached here"),
], ids=["short", "list-args", "int-keys", "unknown-function"])
def test_a_malformed_plain_python_call_gets_an_error(job, call, type, why):
    """A Python call by hash with plain arguments travels as IValues
    (plainPythonCallMessage); one a peer got wrong is answered with what is
    wrong, and the worker serves on."""
    from tests.csrc import hooks

    payload, tensors = hooks().encode_payload(call, type)
    assert payload.startswith(b"\0P") and not tensors
    assert why in _plain_call_error(payload)


def test_a_plain_python_call_with_bad_utf8_gets_an_error(job):
    from tests.csrc import hooks

    payload, _ = hooks().encode_payload(("digest", "f", ("x",), {"k": 1}), "")
    name = struct.pack("<I", 1) + b"f"
    assert payload.count(name) == 1
    assert "decode" in _plain_call_error(payload.replace(name, struct.pack("<I", 1) + b"\xff"))
