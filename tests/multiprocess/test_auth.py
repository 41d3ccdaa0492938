"""Authenticated connections (csrc/auth/handshake.h), tried as an outsider
would: a process without the job's secret connects to a worker's TCP port and
Unix socket and tries to have a pickle executed, to forge the handshake, to
hold a connection open, or to connect as another user. The worker refuses
before parsing a frame, runs nothing, and keeps serving its real peers."""

import os
import pickle
import socket
import subprocess
import sys
import time
import uuid

import pytest
import torch

import torchrpc as rpc
from tests.csrc import hooks
from tests.multiprocess import funcs, raw_peer
from tests.multiprocess.cluster import Cluster


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(2) as c:
        yield c


def _addresses():
    tcp, unix = rpc.rpc_sync("worker1", funcs.debug_info)["addresses"]
    return tcp, unix


def _connect(address):
    if address.startswith("unix:@"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect("\0" + address[len("unix:@"):])
    else:
        host, port = address[len("tcp://"):].rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
    s.settimeout(20)
    return s


def _closed_by_peer(s):
    """Reads until the worker closes the connection (then closes ours); the
    bytes it sent first."""
    data = b""
    with s:
        try:
            while chunk := s.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
    return data


def _python_call_frame(marker):
    payload = raw_peer.evil_python_call(marker)
    return hooks().encode_frame(12, 1, payload, [])  # PYTHON_CALL


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_a_pickle_sent_without_the_handshake_never_runs(kind, tmp_path):
    marker = str(tmp_path / f"pwned-{uuid.uuid4().hex}")
    tcp, unix = _addresses()
    s = _connect(tcp if kind == "tcp" else unix)
    hello_frame = hooks().encode_frame(1, 0, pickle.dumps((0, "worker0")), [])  # the old HELLO
    s.sendall(hello_frame + _python_call_frame(marker))
    start = time.monotonic()
    assert _closed_by_peer(s) == b""  # not even the handshake's answer: the magic is wrong
    assert time.monotonic() - start < 5
    time.sleep(0.2)
    assert not os.path.exists(marker)
    assert torch.equal(rpc.rpc_sync("worker1", funcs.py_add, args=(torch.ones(1), torch.ones(1))), torch.full((1,), 2.0))


def test_a_forged_handshake_is_refused_and_runs_nothing(tmp_path):
    marker = str(tmp_path / f"pwned-{uuid.uuid4().hex}")
    tcp, _ = _addresses()
    s = _connect(tcp)
    # A well-formed HELLO claiming rank 0, then a made-up proof and a frame.
    s.sendall(raw_peer.hello(0, os.urandom(32)))
    proof = b""
    while len(proof) < 76:
        chunk = s.recv(76 - len(proof))
        assert chunk, "the worker closed before answering a well-formed HELLO"
        proof += chunk
    s.sendall(os.urandom(32) + _python_call_frame(marker))
    assert _closed_by_peer(s) == b""
    time.sleep(0.2)
    assert not os.path.exists(marker)
    assert rpc.rpc_sync("worker1", funcs.pid) > 0


def test_a_claim_of_a_rank_that_is_no_worker_is_refused():
    tcp, _ = _addresses()
    s = _connect(tcp)
    s.sendall(raw_peer.hello(7, os.urandom(32)))
    assert _closed_by_peer(s) == b""


def test_a_silent_connection_is_closed_after_the_handshake_deadline():
    tcp, _ = _addresses()
    s = _connect(tcp)
    start = time.monotonic()
    assert _closed_by_peer(s) == b""
    assert 5 < time.monotonic() - start < 15  # kHandshakeSeconds = 10
    assert rpc.rpc_sync("worker1", funcs.pid) > 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_a_process_of_another_user_is_refused_on_the_unix_socket():
    _, unix = _addresses()
    code = (
        "import os, socket, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.connect(chr(0) + sys.argv[1]); s.settimeout(10)\n"
        "print(len(s.recv(100)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, unix[len("unix:@"):]], capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.strip() == "0", out.stderr  # closed at once, before any byte

