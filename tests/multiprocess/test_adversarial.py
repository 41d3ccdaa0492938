"""Attacks on a live worker (issue #21, item 5), each from a separate socket
that speaks raw bytes: outsiders without the secret, and a member of the job
(raw_peer) that sends what no torchrpc worker would. After every attack the
worker is alive and answers its real peer (this process) about as fast as
before, and its memory, open files, CPU and log stay bounded."""

import os
import resource
import socket
import struct
import time
import types

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs, fuzz, probes, raw_peer
from tests.multiprocess.cluster import Cluster

SECRET = b"test-adversarial-job-secret"
MB = 1 << 20


@pytest.fixture(scope="module")
def job():
    # worker1 takes most attacks; worker2, worker3 and worker4 one each of
    # those that killed the worker when these tests were written, so that
    # such a crash fails only its own test
    with Cluster(5, secret=SECRET) as c:
        yield c


def _target(rank):
    """An attacked worker: its name, rank, pid, TCP address and usual latency."""
    name = f"worker{rank}"
    probes.call_latency(name)  # warm-up: connection, function resolution
    return types.SimpleNamespace(name=name, rank=rank, pid=rpc.rpc_sync(name, funcs.pid),
                                 address=probes.tcp_address(name), baseline=probes.call_latency(name, calls=9))


@pytest.fixture(scope="module")
def target(job):
    return _target(1)


def _log_end(job, rank):
    """Where the worker's log says why it died (C++ aborts print a long backtrace), else its end."""
    log = job.log(rank)
    crash = log.rfind("terminate called")
    return log[crash:crash + 600] if crash >= 0 else log[-3000:]


def _still_serves(job, target, what):
    try:
        probes.assert_serves_promptly(target.name, target.baseline, what)
    except rpc.RpcError as exc:
        raise AssertionError(f"{target.name} does not answer after {what}: {exc}\n"
                             f"{_log_end(job, target.rank)}") from exc
    assert target.rank in job.alive(), f"{target.name} died after {what}:\n{_log_end(job, target.rank)}"


def _closed_within(s, seconds):
    """Whether the worker closed `s` within `seconds` (reading and dropping what it sent)."""
    s.settimeout(0.2)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if s.recv(1 << 16) == b"":
                return True
        except socket.timeout:
            pass
        except ConnectionResetError:
            return True
    return False


def _send_ignoring_close(s, data):
    try:
        s.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        pass  # the worker closed first: what the test checks next


def _max_rss_while(pid, seconds):
    """The worker's largest RSS over `seconds` (sampled every 50 ms)."""
    peak, deadline = probes.rss_bytes(pid), time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
        peak = max(peak, probes.rss_bytes(pid))
    return peak


def _plain_connections(address, count):
    """`count` TCP connections to address that never send a byte (nonblocking connects)."""
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(address)
        socks.append(s)
    return socks


def test_an_unauthenticated_pickle_never_runs(job, target, tmp_path):
    marker = tmp_path / "pwned"
    payload = raw_peer.evil_python_call(marker)
    with socket.create_connection(target.address) as s:
        _send_ignoring_close(s, fuzz.frame(fuzz.TYPES["PYTHON_CALL"], 1, payload) * 4)
        assert _closed_within(s, 15), "the worker kept an unauthenticated connection that sent a frame"
    _still_serves(job, target, "an unauthenticated pickle")  # its log is written by now
    assert not marker.exists()


def test_a_pickle_that_would_grow_pythons_memo_is_answered_at_once(job, target):
    """A Python call whose pickle first puts memo entry 101317043 (the wire
    fuzzer made it from a real call): Python's unpickler would grow its memo
    to that many entries, 1.6 GB and seconds of a pool thread under the GIL,
    before it read on. The worker answers an error without unpickling it."""
    rss = probes.rss_bytes(target.pid)
    bomb = b"\x80\x05N" + b"r" + struct.pack("<I", 101_317_043) + b"."
    with raw_peer.connect(target.address, SECRET, rank=0) as s:
        s.settimeout(20)
        s.sendall(fuzz.frame(fuzz.TYPES["PYTHON_CALL"], 1, bomb))
        type_, id_, answer = fuzz.read_frame(s)
    assert (type_, id_) == (fuzz.TYPES["EXCEPTION"], 1)
    assert b"memo index 101317043 skips ahead" in answer
    assert probes.rss_bytes(target.pid) - rss < 200 * MB
    _still_serves(job, target, "a pickle that would grow Python's memo")


@pytest.mark.parametrize("section", ["payload", "tensor"])
def test_a_declared_gigabyte_that_never_comes_takes_no_memory(job, target, section):
    """Memory is populated as data arrives: a frame that declares 1 GB and
    sends 1 MB of it costs about 1 MB while it is held open (the worker may
    also refuse it)."""
    rss = probes.rss_bytes(target.pid)
    if section == "payload":
        frame = fuzz.header(fuzz.TYPES["PYTHON_CALL"], 1, 1 << 30)
    else:
        desc = fuzz.descriptor("uint8", [1 << 30], 1 << 30)
        frame = fuzz.header(fuzz.TYPES["SCRIPT_CALL"], 1, 8, 1, len(desc)) + b"\0" * 8 + desc
    with raw_peer.connect(target.address, SECRET, rank=0) as s:
        _send_ignoring_close(s, frame + b"\0" * MB)
        peak = _max_rss_while(target.pid, 2.0)
        _still_serves(job, target, f"a declared 1 GB {section} held open")
    assert peak - rss < 200 * MB, f"worker1's RSS grew by {(peak - rss) // MB} MB for 1 MB received"


def test_a_peer_that_never_reads_its_responses_does_not_block_others(job, target):
    """2000 requests whose responses (256 KB each) the sender never reads:
    the worker stops reading from it (or drops it) instead of blocking its
    pool threads on the writes or queueing 500 MB of responses."""
    payload, tensors = fuzz.jit_pickle(("aten::zeros", (fuzz.IntList([1 << 16]),)))
    assert not tensors
    requests = b"".join(fuzz.frame(fuzz.TYPES["BUILTIN_CALL"], i + 1, payload) for i in range(2000))
    rss = probes.rss_bytes(target.pid)
    s = raw_peer.connect(target.address, SECRET, rank=0)
    with s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        sent, deadline = 0, time.monotonic() + 2
        while sent < len(requests) and time.monotonic() < deadline:
            try:
                sent += s.send(requests[sent:])
            except BlockingIOError:
                time.sleep(0.01)  # the worker reads no more of them for now
        peak = _max_rss_while(target.pid, 1.0)
        _still_serves(job, target, "a peer that reads none of its 2000 responses")
    assert peak - rss < 256 * MB, f"worker1's RSS grew by {(peak - rss) // MB} MB of unread responses"


def test_a_flood_of_garbage_connections_logs_a_bounded_amount(job, target):
    """1000 connections that send garbage instead of the handshake: the
    worker's log grows by a bounded amount (rate-limited lines), not a line each."""
    logged = len(job.log(1))
    fds = probes.fd_count(target.pid)
    for i in range(1000):
        with socket.create_connection(target.address) as s:
            _send_ignoring_close(s, os.urandom(64))
    deadline = time.monotonic() + 10
    while probes.fd_count(target.pid) > fds + 8 and time.monotonic() < deadline:
        time.sleep(0.05)  # until the worker has closed them
    grew = len(job.log(1)) - logged
    assert grew < 16 * 1024, f"worker1's log grew by {grew} bytes for 1000 garbage connections; its end:\n" + \
        job.log(1)[-600:]
    _still_serves(job, target, "1000 garbage connections")


def test_many_held_unauthenticated_connections_are_capped(job, target):
    """1500 connections held open without a byte: the worker keeps a bounded
    number of them (assumed cap: under 1024 unauthenticated connections) and
    serves its real peer meanwhile."""
    fds = probes.fd_count(target.pid)
    socks = _plain_connections(target.address, 1500)
    try:
        peak, deadline = fds, time.monotonic() + 2
        while time.monotonic() < deadline:
            peak = max(peak, probes.fd_count(target.pid))
            time.sleep(0.05)
        _still_serves(job, target, "1500 held connections")
    finally:
        for s in socks:
            s.close()
    assert peak - fds < 1024, f"worker1 holds {peak - fds} more fds for 1500 unauthenticated connections"


def test_running_out_of_file_descriptors_backs_off(job, target):
    """With its fd limit reached (EMFILE on accept), the worker neither spins
    nor floods its log, serves its real peer, and accepts members again once
    fds are free."""
    soft, hard = resource.prlimit(target.pid, resource.RLIMIT_NOFILE)
    limit = probes.fd_count(target.pid) + 32
    resource.prlimit(target.pid, resource.RLIMIT_NOFILE, (limit, hard))
    socks = []
    try:
        socks = _plain_connections(target.address, 200)
        deadline = time.monotonic() + 5
        while probes.fd_count(target.pid) < limit - 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        logged, cpu = len(job.log(1)), probes.cpu_seconds(target.pid)
        window = time.monotonic()
        _max_rss_while(target.pid, 2.0)  # a 2 s window with connections waiting in the backlog
        cpu = (probes.cpu_seconds(target.pid) - cpu) / (time.monotonic() - window)
        grew = len(job.log(1)) - logged
        _still_serves(job, target, "fd exhaustion")
    finally:
        for s in socks:
            s.close()
        resource.prlimit(target.pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert cpu < 0.25, f"worker1 used {cpu:.0%} of a core while accept() failed with EMFILE"
    assert grew < 8 * 1024, f"worker1's log grew by {grew} bytes in 2 s of EMFILE; its end:\n" + job.log(1)[-600:]
    with raw_peer.connect(target.address, SECRET, rank=0, timeout=5) as s:
        s.sendall(fuzz.script_call(1, "tests.triple", (torch.ones(1),)))
        assert fuzz.read_frame(s)[:2] == (fuzz.TYPES["SCRIPT_RET"], 1)


class _Tagged:
    """An empty list that its pickle tags with a TorchScript type, as torch
    pickles a typed container (torch.jit._pickle.restore_type_tag)."""

    def __init__(self, tag):
        self.tag = tag

    def __reduce__(self):
        from torch.jit._pickle import restore_type_tag

        return restore_type_tag, ([], self.tag)


def test_a_type_tag_nested_past_the_cap_is_answered_at_once(job):
    """torch's type parser recurses once per level of a container's type tag:
    a tag of 5,000 levels (30 KB) crashed a worker with a stack overflow."""
    target = _target(4)
    deep = "List[" * 20000 + "int" + "]" * 20000
    with raw_peer.connect(target.address, SECRET, rank=0) as s:
        s.settimeout(20)
        s.sendall(fuzz.script_call(1, "tests.add", (_Tagged(deep), 1)))
        type_, id_, answer = fuzz.read_frame(s)
    assert (type_, id_) == (fuzz.TYPES["EXCEPTION"], 1)
    assert b"a type tag nested 20000 levels deep, over the cap of 100" in answer
    _still_serves(job, target, "a type tag nested 20,000 levels deep")


@pytest.mark.parametrize("rank, dtype, sizes, what", [
    (2, "uint8", [100 << 30], "a 100 GB tensor"),
    (3, "float32", [0, 1 << 62, 1 << 62], "an empty tensor whose strides overflow"),
], ids=["100GB", "stride-overflow"])
def test_a_tensor_that_cannot_be_allocated_is_refused(job, rank, dtype, sizes, what):
    """The frame is refused (connection closed), nothing is allocated for it,
    and the worker lives: each on its own worker, as both killed it (an
    uncaught std::bad_alloc and c10::Error on the receiving thread)."""
    target = _target(rank)
    rss = probes.rss_bytes(target.pid)
    nbytes = 100 << 30 if sizes[0] else 0
    desc = fuzz.descriptor(dtype, sizes, nbytes)
    frame = fuzz.header(fuzz.TYPES["SCRIPT_CALL"], 1, 8, 1, len(desc)) + b"\0" * 8 + desc
    with raw_peer.connect(target.address, SECRET, rank=0) as s:
        _send_ignoring_close(s, frame + b"\0" * MB)  # the first MB of its data, if it has any
        closed = _closed_within(s, 10)
    _still_serves(job, target, what)
    if nbytes:
        assert closed, f"{target.name} kept reading a frame that declares {what}"
    grew = probes.rss_bytes(target.pid) - rss
    assert grew < 100 * MB, f"{target.name}'s RSS grew by {grew // MB} MB"
