"""A peer that speaks the wire by hand, for tests of hostile input from a
member of the job: the connector's side of the handshake
(csrc/auth/handshake.h), written again here from its description, then
whatever bytes the test sends (whole frames: frame, read_frame)."""

import hashlib
import hmac
import os
import pickle
import socket
import struct

MAGIC = 0x48505254  # "TRPH"
VERSION = 1


class TouchesFile:
    """Unpickling this creates `path` (a shell command): what an attacker
    would send; the file's absence proves it never ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def hello(rank, nonce):
    """The connector's first message: magic, version, nonce, rank."""
    return struct.pack("<IHH", MAGIC, VERSION, 0) + nonce + struct.pack("<i", rank)


def recv_exactly(s, n):
    """The next n bytes from socket s."""
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def evil_python_call(path):
    """A PYTHON_CALL payload (python_fallback's (digest, code, name, args,
    kwargs)) whose unpickling creates the file `path`."""
    return pickle.dumps((b"0" * 16, None, "evil", (TouchesFile(path),), {}))


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


FRAME_MAGIC = 0x43505254  # "TRPC", message/wire.h kFrameMagic
WIRE_VERSION = 5  # message/wire.cpp kWireVersion
_FRAME_HEADER = struct.Struct("<IHHQQII")  # magic, version, type, id, payload, tensors, descriptor bytes


def frame(type_, request_id, payload=b""):
    """A frame (message/wire.h) of one message without tensors."""
    return _FRAME_HEADER.pack(FRAME_MAGIC, WIRE_VERSION, type_, request_id, len(payload), 0, 0) + payload


def read_frame(s):
    """(type, id, payload) of the next frame, which must carry no tensors."""
    magic, version, type_, request_id, payload_len, num_tensors, desc_len = _FRAME_HEADER.unpack(
        recv_exactly(s, _FRAME_HEADER.size))
    assert (magic, version, num_tensors, desc_len) == (FRAME_MAGIC, WIRE_VERSION, 0, 0)
    return type_, request_id, recv_exactly(s, payload_len)


RREF_FETCH = 31  # csrc/message/message_type.h
RREF_METHOD_CALL = 35


def rref_id(worker, local):
    """An RRef id as the RRef messages carry it (csrc/rref/rref_messages.cpp)."""
    return struct.pack("<iq", worker, local)


def method_call_payload(worker, local, name):
    """RREF_METHOD_CALL's payload: the pickled (worker, local, name, args, kwargs)
    tuple; torch's unpickler reads Python's protocol 2 for these types."""
    return pickle.dumps((worker, local, name, (), {}), protocol=2)
