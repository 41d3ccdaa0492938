"""A peer that speaks the wire by hand, for tests of hostile input from a
member of the job: the connector's side of the handshake
(csrc/auth/handshake.h), written again here from its description, then
whatever bytes the test sends."""

import hashlib
import hmac
import os
import pickle
import socket
import struct

MAGIC = 0x48505254  # "TRPH"
VERSION = 1


def hello(rank, nonce):
    """The connector's first message: magic, version, nonce, rank."""
    return struct.pack("<IHH", MAGIC, VERSION, 0) + nonce + struct.pack("<i", rank)


def recv_exactly(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


class RunsCode:
    """Unpickling this runs `touch path`: what an attacker would send."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def evil_python_call(path):
    """A PYTHON_CALL payload (python_fallback's (digest, code, name, args,
    kwargs)) whose unpickling creates the file `path`."""
    return pickle.dumps((b"0" * 16, None, "evil", (RunsCode(path),), {}))


def connect(address, secret, rank, timeout=10):
    """A socket to `address` ("host", port) authenticated as `rank` with
    `secret`; raises if the worker's proof is wrong."""
    s = socket.create_connection(address, timeout=timeout)
    nonce = os.urandom(32)
    s.sendall(hello(rank, nonce))
    proof = recv_exactly(s, 76)
    magic, version, _ = struct.unpack("<IHH", proof[:8])
    assert (magic, version) == (MAGIC, VERSION)
    their_nonce, their_rank, their_mac = proof[8:40], struct.unpack("<i", proof[40:44])[0], proof[44:]
    ranks = struct.pack("<ii", rank, their_rank)
    expected = hmac.new(secret, b"acceptor" + nonce + their_nonce + ranks, hashlib.sha256).digest()
    assert hmac.compare_digest(their_mac, expected), "the worker's proof does not match the secret"
    s.sendall(hmac.new(secret, b"connector" + nonce + their_nonce + ranks, hashlib.sha256).digest())
    return s
