"""Frames of the wire (csrc/message/wire.h) built by hand, and a mutation
fuzzer that sends them to a worker as an authenticated member of the job
(raw_peer). test_fuzz.py builds valid seed frames of every message type in
the pytest process (it needs torch for their payloads) and runs
``python -m tests.multiprocess.fuzz`` on them, which needs neither torch nor
torchrpc and so starts in a blink.

The fuzzer reconnects whenever the worker closes the connection, and after
any input whose declared lengths do not match what it sent (a truncated
frame, or a declared 1 GB payload), so that the next input starts a frame.
"""

import argparse
import errno
import pickle
import random
import socket
import struct
import sys
import time

from tests.multiprocess import raw_peer

MAGIC = raw_peer.FRAME_MAGIC
HEADER = struct.Struct("<IHHQQII")  # magic, version, type, id, payloadLen, numTensors, descLen
# dtype, ndim, flags, layout code, 3 zero bytes; then as wire.h says: a strided
# tensor's sizes, strides (flags & STRIDES), nbytes, address (flags & LENT); a
# sparse one's sizes and its components' descriptors
DESC = struct.Struct("<BBHB3x")
LENT, STRIDES, COALESCED = 1, 2, 4
STRIDED, SPARSE_COO, SPARSE_CSR = 0, 1, 2  # ... CSC 3, BSR 4, BSC 5

# message/message_type.h
TYPES = {
    "GOODBYE": 2, "LEND_OFFER": 5, "LEND_ACCEPT": 6, "LEND_RELEASE": 7,
    "SCRIPT_CALL": 10, "BUILTIN_CALL": 11, "PYTHON_CALL": 12,
    "SCRIPT_RET": 20, "PYTHON_RET": 21, "EXCEPTION": 29,
    "REMOTE_CALL": 30, "RREF_FETCH": 31, "RREF_USER_DELETE": 32, "RREF_FORK_REQUEST": 33,
    "RREF_CHILD_ACCEPT": 34, "RREF_METHOD_CALL": 35,
    "AUTOGRAD_CALL": 50, "AUTOGRAD_RET": 51, "AUTOGRAD_BACKWARD": 52, "AUTOGRAD_CLEANUP": 53,
    "AUTOGRAD_PASS_DONE": 54,
}
# The TORCHRPC backend's frames (message_type.h): upstream's Message inside
# (torch_backend/envelope.h), of upstream's types (torch/csrc/distributed/rpc/message.h)
TORCH_REQUEST, TORCH_RESPONSE = 90, 91
_REQ, _RESP = 0x100, 0x200
UPSTREAM_TYPES = {
    "SCRIPT_CALL": 0 | _REQ, "SCRIPT_RET": 1 | _RESP, "PYTHON_CALL": 2 | _REQ, "PYTHON_RET": 3 | _RESP,
    "SCRIPT_REMOTE_CALL": 4 | _REQ, "PYTHON_REMOTE_CALL": 5 | _REQ, "REMOTE_RET": 6 | _RESP,
    "SCRIPT_RREF_FETCH_CALL": 7 | _REQ, "PYTHON_RREF_FETCH_CALL": 8 | _REQ, "SCRIPT_RREF_FETCH_RET": 9 | _RESP,
    "PYTHON_RREF_FETCH_RET": 10 | _RESP, "RREF_USER_DELETE": 11 | _REQ, "RREF_FORK_REQUEST": 12 | _REQ,
    "RREF_CHILD_ACCEPT": 13 | _REQ, "RREF_ACK": 14 | _RESP, "FORWARD_AUTOGRAD_REQ": 15 | _REQ,
    "FORWARD_AUTOGRAD_RESP": 16 | _RESP, "BACKWARD_AUTOGRAD_REQ": 17 | _REQ, "BACKWARD_AUTOGRAD_RESP": 18 | _RESP,
    "CLEANUP_AUTOGRAD_CONTEXT_REQ": 19 | _REQ, "CLEANUP_AUTOGRAD_CONTEXT_RESP": 20 | _RESP,
    "RUN_WITH_PROFILING_REQ": 21 | _REQ, "RUN_WITH_PROFILING_RESP": 22 | _RESP, "RREF_BACKWARD_REQ": 23 | _REQ,
    "RREF_BACKWARD_RESP": 24 | _RESP, "EXCEPTION": 55 | _RESP,
}
DTYPE_CODES = {"uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float16": 5, "float32": 6,
               "float64": 7, "bool": 11}  # c10::ScalarType


def header(type_, id_, payload_len, num_tensors=0, desc_len=0, magic=MAGIC, version=raw_peer.WIRE_VERSION):
    return HEADER.pack(magic, version, type_, id_, payload_len, num_tensors, desc_len)


def descriptor(dtype, sizes, nbytes, strides=None):
    """A strided tensor's descriptor (contiguous without strides)."""
    flags = 0 if strides is None else STRIDES
    return DESC.pack(DTYPE_CODES[dtype], len(sizes), flags, STRIDED) + struct.pack(f"<{len(sizes)}q", *sizes) + \
        struct.pack(f"<{len(strides or [])}q", *(strides or [])) + struct.pack("<Q", nbytes)


def frame(type_, id_, payload, tensors=()):
    """A frame; tensors are (dtype name, sizes, data bytes) of contiguous
    tensors, or (descriptor, [buffer bytes]) as _tensor() makes them."""
    described = [t if len(t) == 2 else (descriptor(t[0], t[1], len(t[2])), [t[2]]) for t in tensors]
    desc = b"".join(d for d, _ in described)
    return header(type_, id_, len(payload), len(tensors), len(desc)) + payload + desc + \
        b"".join(b for _, buffers in described for b in buffers)


def _buffers(desc, pos, end, num_tensors):
    """(nbytes, lent) of each buffer the descriptors in desc[pos:end] declare; None if they cannot be read."""
    out = []

    def strided(pos, header):
        _, ndim, flags, _ = header
        pos += 8 * ndim * (2 if flags & STRIDES else 1)
        if pos + 8 > end:
            return None
        out.append((struct.unpack_from("<Q", desc, pos)[0], bool(flags & LENT)))
        return pos + 8 + (8 if flags & LENT else 0)

    for _ in range(num_tensors):
        if pos + DESC.size > end:
            return None
        h = DESC.unpack_from(desc, pos)
        pos += DESC.size
        if h[3] == STRIDED:
            pos = strided(pos, h)
        else:
            pos += 8 * h[1]
            for _ in range(2 if h[3] == SPARSE_COO else 3):
                if pos is None or pos + DESC.size > end:
                    return None
                pos = strided(pos + DESC.size, DESC.unpack_from(desc, pos))
        if pos is None:
            return None
    return out


def declared_length(data):
    """The length of the frame that `data` starts with, as its header and
    descriptors declare it; None when they cannot be read."""
    if len(data) < HEADER.size:
        return None
    _, _, _, _, payload_len, num_tensors, desc_len = HEADER.unpack_from(data)
    pos = HEADER.size + payload_len
    end = pos + desc_len
    if end > len(data):
        return None
    buffers = _buffers(data, pos, end, num_tensors)
    return None if buffers is None else end + sum(n for n, lent in buffers if not lent)


def read_frame(sock):
    """(type, id, payload) of the next frame the worker sends; its tensors are read and dropped."""
    type_, id_, payload_len, num_tensors, desc_len = _unpack_header(raw_peer.recv_exactly(sock, HEADER.size))
    payload = raw_peer.recv_exactly(sock, payload_len)
    desc = raw_peer.recv_exactly(sock, desc_len)
    for nbytes, lent in _buffers(desc, 0, len(desc), num_tensors):
        raw_peer.recv_exactly(sock, 0 if lent else nbytes)
    return type_, id_, payload


def _unpack_header(data):
    magic, version, type_, id_, payload_len, num_tensors, desc_len = HEADER.unpack(data)
    assert (magic, version) == (MAGIC, raw_peer.WIRE_VERSION), f"the worker sent a bad header {data!r}"
    return type_, id_, payload_len, num_tensors, desc_len


# ---- valid frames of every message type (needs torch) -------------------------


class IntList(list):
    """A List[int] for jit_pickle (a plain list arrives as List[Any])."""


def jit_pickle(value):
    """(payload, tensors) as torch::jit::pickle writes an IValue: protocol 2,
    tensors replaced by torch.jit._pickle.build_tensor_from_id(index), IntLists
    by build_intlist(list)."""
    import io

    import torch
    from torch.jit._pickle import build_intlist, build_tensor_from_id

    tensors = []

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj):
            if type(obj) is TypedDict:
                from torch.jit._pickle import restore_type_tag
                return restore_type_tag, (dict(obj), obj.tag)
            if isinstance(obj, torch.Tensor):
                tensors.append(_tensor(obj))
                return build_tensor_from_id, (len(tensors) - 1,)
            if type(obj) is IntList:
                return build_intlist, (list(obj),)
            return NotImplemented

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(value)
    return buf.getvalue(), tensors


class TypedDict(dict):
    """A dict that torch's pickler writes with its type tag ("Dict[str, str]")."""

    def __init__(self, tag, *args):
        super().__init__(*args)
        self.tag = tag


def script_call(id_, name, args):
    """A SCRIPT_CALL frame of the function registered as `name`."""
    payload, tensors = jit_pickle((name, "", tuple(args), {}, None))
    return frame(TYPES["SCRIPT_CALL"], id_, payload, tensors)


def _tensor(t):
    """(descriptor, [buffers]) of a tensor as the wire sends it: a strided one
    as the span of its storage with its strides, a sparse one as its components."""
    import torch

    if t.layout == torch.sparse_coo:
        parts, code, flags = [t._indices(), t._values()], SPARSE_COO, COALESCED if t.is_coalesced() else 0
    elif t.layout == torch.sparse_csr:
        parts, code, flags = [t.crow_indices(), t.col_indices(), t.values()], SPARSE_CSR, 0
    else:
        dtype = str(t.dtype).removeprefix("torch.")
        if t.is_contiguous():
            return descriptor(dtype, list(t.shape), t.nbytes), [t.numpy().tobytes()]
        span = (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()
        start = t.storage_offset() * t.element_size()
        data = bytes(t.untyped_storage())[start:start + span]
        return descriptor(dtype, list(t.shape), span, strides=list(t.stride())), [data]
    described = [_tensor(p) for p in parts]
    desc = DESC.pack(DTYPE_CODES[str(t.dtype).removeprefix("torch.")], t.dim(), flags, code) + \
        struct.pack(f"<{t.dim()}q", *t.shape) + b"".join(d for d, _ in described)
    return desc, [b for _, buffers in described for b in buffers]


def _ids(*ids):
    """RRef/fork ids as rref_messages.cpp writes them: i32 worker, i64 counter."""
    return b"".join(struct.pack("<iq", worker, local) for worker, local in ids)


def _autograd_envelope(inner_type, context_id, tensors):
    # recorder.cpp Envelope: innerType u16, flags u8, 0 u8, 0 i32, contextId i64, sendId i64,
    # numTensors u32, 0 u32; then one mask bit per tensor
    return struct.pack("<HBBiqqII", inner_type, 0, 0, 0, context_id, -1, len(tensors), 0) + \
        bytes((len(tensors) + 7) // 8)


def seed_frames(me, python_call, python_object):
    """Valid frames of every message type in message_type.h, sent as rank
    `me`, with request ids 1..N. python_call and python_object: (payload,
    tensors) of PYTHON_CALLs (torchrpc.python_fallback.pickled_call) of a
    harmless function and of a constructor of an object with a method
    bump(int), for the RRef the frames create. Returns [(type name, frame)]."""
    import torch

    a, b = torch.arange(4, dtype=torch.float32), torch.ones(4)
    script, script_tensors = jit_pickle(("tests.add", "", (a, b), {}, None))
    builtin, builtin_tensors = jit_pickle(("aten::add.Tensor", (a, b, 1)))
    # layouts (tensor_layout.h): sparse COO and CSR arguments, a transposed one
    sparse = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    coo, coo_tensors = jit_pickle(("aten::add.Tensor", (sparse.to_sparse(), sparse.to_sparse(), 1)))
    csr, csr_tensors = jit_pickle(("aten::add.Tensor", (sparse.to_sparse_csr(), sparse.to_sparse_csr(), 1)))
    transposed = torch.arange(6.0).reshape(2, 3).t()
    # counters above 2**55: torch's unpickler reads Python's LONG1 only with 8 bytes
    rref, fork, child = (me, 1 << 60), (me, (1 << 60) + 1), (me, (1 << 60) + 2)
    method, _ = jit_pickle((me, 1 << 60, "bump", (2,), {}))
    py_payload, py_tensors = python_call
    new_payload, new_tensors = python_object
    ret, ret_tensors = jit_pickle((a,))
    exc, _ = jit_pickle(("ValueError", "made up", "", "f", "worker9"))
    backward = struct.pack("<qqBIiqq", 7, 3, 0, 1, me, 1, 1) + b"\x01\x00"  # context 7, one gradient
    pass_done = struct.pack("<q", 1) + struct.pack("<qI", 1, 0)
    T = TYPES
    frames = [
        ("SCRIPT_CALL", script_call(1, "tests.add", (a, b))),
        ("BUILTIN_CALL", frame(T["BUILTIN_CALL"], 2, builtin, builtin_tensors)),
        ("PYTHON_CALL", frame(T["PYTHON_CALL"], 3, py_payload, [_tensor(t) for t in py_tensors])),
        ("REMOTE_CALL", frame(T["REMOTE_CALL"], 4, _ids(rref, fork) + struct.pack("<H", T["PYTHON_CALL"]) + new_payload,
                              [_tensor(t) for t in new_tensors])),
        ("RREF_FETCH", frame(T["RREF_FETCH"], 5, _ids(rref))),
        ("RREF_METHOD_CALL", frame(T["RREF_METHOD_CALL"], 6, method)),
        ("RREF_FORK_REQUEST", frame(T["RREF_FORK_REQUEST"], 7, _ids(rref, child))),
        ("RREF_CHILD_ACCEPT", frame(T["RREF_CHILD_ACCEPT"], 8, _ids(child))),
        ("RREF_USER_DELETE", frame(T["RREF_USER_DELETE"], 9, _ids(rref, child))),
        ("RREF_USER_DELETE", frame(T["RREF_USER_DELETE"], 10, _ids(rref, fork))),
        ("AUTOGRAD_CALL", frame(T["AUTOGRAD_CALL"], 11,
                                _autograd_envelope(T["SCRIPT_CALL"], 7, script_tensors) + script, script_tensors)),
        ("AUTOGRAD_BACKWARD", frame(T["AUTOGRAD_BACKWARD"], 12, backward, [_tensor(a)])),
        ("AUTOGRAD_PASS_DONE", frame(T["AUTOGRAD_PASS_DONE"], 13, pass_done)),
        ("AUTOGRAD_CLEANUP", frame(T["AUTOGRAD_CLEANUP"], 14, struct.pack("<q", 7))),
        ("BUILTIN_CALL", frame(T["BUILTIN_CALL"], 15, coo, coo_tensors)),
        ("BUILTIN_CALL", frame(T["BUILTIN_CALL"], 16, csr, csr_tensors)),
        ("SCRIPT_CALL", script_call(17, "tests.add", (transposed, transposed))),
        # responses to nothing, and the connection's own frames
        ("SCRIPT_RET", frame(T["SCRIPT_RET"], 18, ret, ret_tensors)),
        ("PYTHON_RET", frame(T["PYTHON_RET"], 19, pickle.dumps(3))),
        ("EXCEPTION", frame(T["EXCEPTION"], 20, exc)),
        ("AUTOGRAD_RET", frame(T["AUTOGRAD_RET"], 21, _autograd_envelope(T["SCRIPT_RET"], 7, ret_tensors) + ret,
                               ret_tensors)),
        ("LEND_OFFER", frame(T["LEND_OFFER"], 0, struct.pack("<i", 1) + b"/proc/self/mem")),
        ("LEND_ACCEPT", frame(T["LEND_ACCEPT"], 0, b"")),
        ("LEND_RELEASE", frame(T["LEND_RELEASE"], 0, struct.pack("<Q", 0))),
        ("GOODBYE", frame(T["GOODBYE"], 0, b"")),
    ]
    assert {name for name, _ in frames} == set(TYPES)
    return frames


def backend_seed_frames(me, script_name, python_udf):
    """Valid TORCH_REQUEST frames of upstream's request types, as its
    serializers write them, sent as rank `me`, and one response to nothing.
    script_name: a TorchScript function's qualified name, taking (Tensor,
    Tensor); python_udf: (bytes, tensors) of upstream's pickled PythonUDF
    (torch.distributed.rpc.internal._internal_rpc_pickler.serialize)."""
    import torch

    U = UPSTREAM_TYPES
    a, b = torch.arange(4.0), torch.ones(4)
    builtin = (a, b, 1, str(torch.ops.aten.add.Tensor._schema), "torch.ops.aten.add")
    script = (a, b, False, script_name)
    rref, fork, child = (me, 1 << 60), (me, (1 << 60) + 1), (me, (1 << 60) + 2)
    udf, udf_tensors = python_udf

    def torch_frame(id_, type_name, payload, tensors, grads=False):
        flags = bytes(1 if grads and t.is_floating_point() else 0 for t in tensors)
        return frame(TORCH_REQUEST, id_, struct.pack("<i", U[type_name]) + flags + payload,
                     [_tensor(t) for t in tensors])

    def jit(value):  # (payload, the tensors as torch tensors)
        found = []

        def note(t):
            found.append(t)
            return t
        payload, _ = jit_pickle(_map_tensors(value, note))
        return payload, found

    def with_raw_string(values, raw):
        """torch's pickle of `values`, whose "<raw>" string holds `raw` (Python's pickle: any bytes)."""
        mark = "R" * len(raw)  # ASCII: as many bytes in the pickle as raw has
        payload, tensors = jit(tuple(mark if isinstance(v, str) and v == "<raw>" else v for v in values))
        return payload.replace(mark.encode(), raw, 1), tensors

    def autograd(type_name, payload, context_id):
        tail, _ = jit_pickle((U[type_name], context_id, 1, me, TypedDict("Dict[str, str]")))
        return payload + tail + struct.pack(">q", len(tail))

    script_payload, script_tensors = jit(script)
    builtin_payload, builtin_tensors = jit(builtin)
    remote_payload, remote_tensors = jit(builtin + (rref, fork))
    py_remote_payload, _ = with_raw_string(tuple(udf_tensors) + ("<raw>", (me, (1 << 60) + 3),
                                                                  (me, (1 << 60) + 4), False), udf)
    grads_payload, grads_tensors = jit((a, 7, 2, False))
    frames = [
        ("SCRIPT_CALL", torch_frame(1, "SCRIPT_CALL", script_payload, script_tensors)),
        ("SCRIPT_CALL", torch_frame(2, "SCRIPT_CALL", builtin_payload, builtin_tensors)),
        ("PYTHON_CALL", torch_frame(3, "PYTHON_CALL", b"\x00" + udf, list(udf_tensors))),
        ("SCRIPT_REMOTE_CALL", torch_frame(4, "SCRIPT_REMOTE_CALL", remote_payload, remote_tensors)),
        ("PYTHON_REMOTE_CALL", torch_frame(5, "PYTHON_REMOTE_CALL", py_remote_payload, list(udf_tensors))),
        ("SCRIPT_RREF_FETCH_CALL", torch_frame(6, "SCRIPT_RREF_FETCH_CALL", jit((rref, me))[0], [])),
        ("PYTHON_RREF_FETCH_CALL", torch_frame(7, "PYTHON_RREF_FETCH_CALL", jit(((me, (1 << 60) + 3), me))[0], [])),
        ("RREF_FORK_REQUEST", torch_frame(8, "RREF_FORK_REQUEST", jit((rref, child))[0], [])),
        ("RREF_CHILD_ACCEPT", torch_frame(9, "RREF_CHILD_ACCEPT", jit((child,))[0], [])),
        ("RREF_USER_DELETE", torch_frame(10, "RREF_USER_DELETE", jit((rref, child))[0], [])),
        ("FORWARD_AUTOGRAD_REQ", torch_frame(11, "FORWARD_AUTOGRAD_REQ", autograd("SCRIPT_CALL", builtin_payload, 7),
                                             builtin_tensors, grads=True)),
        ("BACKWARD_AUTOGRAD_REQ", torch_frame(12, "BACKWARD_AUTOGRAD_REQ", grads_payload, grads_tensors)),
        ("RREF_BACKWARD_REQ", torch_frame(13, "RREF_BACKWARD_REQ", jit((rref, 7, False))[0], [])),
        ("CLEANUP_AUTOGRAD_CONTEXT_REQ", torch_frame(14, "CLEANUP_AUTOGRAD_CONTEXT_REQ", jit(7)[0], [])),
        ("SCRIPT_RET", frame(TORCH_RESPONSE, 99, struct.pack("<i", U["SCRIPT_RET"]) + b"\x00" + jit(a)[0],
                             [_tensor(a)])),
    ]
    return frames


def _map_tensors(value, f):
    """`value` with f applied to each tensor in it (tuples, lists and dicts followed)."""
    import torch

    if isinstance(value, torch.Tensor):
        return f(value)
    if isinstance(value, tuple):
        return tuple(_map_tensors(v, f) for v in value)
    if isinstance(value, list):
        return [_map_tensors(v, f) for v in value]
    return value


# ---- mutations --------------------------------------------------------------

_HUGE = [1 << 30, (1 << 31) - 1, 1 << 31, 1 << 32, (1 << 40) + 1, (1 << 63) - 1, (1 << 64) - 1]


def _bit_flips(rng, data):
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def _byte_sets(rng, data):
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        out[rng.randrange(len(out))] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
    return bytes(out)


def _truncate(rng, data):
    return data[:rng.randrange(len(data))]


def _huge_length(rng, data):
    # one of payloadLen (offset 16), numTensors (24), descLen (28), or a tensor's nbytes/size
    if len(data) < HEADER.size:
        return data
    out = bytearray(data)
    field = rng.choice(["payload", "tensors", "desc", "inner"])
    if field == "payload":
        struct.pack_into("<Q", out, 16, rng.choice(_HUGE))
    elif field == "tensors":
        struct.pack_into("<I", out, 24, rng.choice([1 << 16, (1 << 16) + 1, 1 << 31, (1 << 32) - 1]))
    elif field == "desc":
        struct.pack_into("<I", out, 28, rng.choice([1 << 20, 1 << 31, (1 << 32) - 1]))
    elif len(out) >= HEADER.size + 8:
        pos = rng.randrange(HEADER.size, len(out) - 7)
        struct.pack_into("<Q", out, pos, rng.choice(_HUGE))
    return bytes(out)


def _random_type_and_id(rng, data):
    if len(data) < HEADER.size:
        return data
    out = bytearray(data)
    type_ = rng.choice([rng.choice(list(TYPES.values())), rng.randrange(1 << 16), 0, 1, 3, 8, 9, 55])
    struct.pack_into("<HQ", out, 6, type_, rng.choice([0, 1, rng.randrange(1 << 64), (1 << 64) - 1]))
    return bytes(out)


def _random_descriptors(rng, data):
    """Replaces the descriptor section with random descriptors (sizes,
    dtypes, flags, nbytes that may or may not agree)."""
    if len(data) < HEADER.size:
        return data
    type_, id_, payload_len = HEADER.unpack_from(data)[2:5]
    payload = data[HEADER.size:HEADER.size + payload_len]
    def sizes(ndim):
        return [rng.choice([0, 1, 3, 1 << 20, -1, 1 << 40, rng.randrange(1 << 63)]) for _ in range(ndim)]

    def strided():
        ndim = rng.choice([0, 1, 2, 3, 64, 65, 255])
        flags = rng.choice([0, 0, LENT, STRIDES, STRIDES, LENT | STRIDES, COALESCED, 8])
        d = DESC.pack(rng.choice([0, 3, 4, 6, 11, 12, 40, 255]), ndim, flags, rng.choice([STRIDED] * 6 + [1, 2, 9]))
        d += struct.pack(f"<{ndim}q", *sizes(ndim))
        if flags & STRIDES:
            d += struct.pack(f"<{ndim}q", *[rng.choice([0, 1, 2, -1, 1 << 62]) for _ in range(ndim)])
        d += struct.pack("<Q", rng.choice([0, 4, 16, 1 << 30, rng.randrange(1 << 64)]))
        if flags & LENT or rng.random() < 0.1:
            d += struct.pack("<Q", rng.randrange(1 << 64))  # an address, as a lent tensor's
        return d

    descs = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.7:
            descs.append(strided())
            continue
        ndim = rng.choice([0, 1, 2, 3, 65])
        d = DESC.pack(rng.choice([4, 6, 40]), ndim, rng.choice([0, COALESCED, 1]), rng.choice([1, 2, 3, 4, 5, 6]))
        descs.append(d + struct.pack(f"<{ndim}q", *sizes(ndim)) + b"".join(strided() for _ in range(rng.randint(1, 3))))
    desc = b"".join(descs)
    body = payload + desc + bytes(rng.randrange(64))
    return header(type_, id_, len(payload), len(descs), len(desc)) + body


def _splice(rng, data, seeds):
    other = rng.choice(seeds)
    cut = rng.randrange(len(data) + 1)
    return data[:cut] + other[rng.randrange(len(other) + 1):]


def _random_bytes(rng, data):
    return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 96)))


def _payload_garbage(rng, data):
    """Keeps a valid header and framing but randomizes a span of the payload."""
    if len(data) <= HEADER.size:
        return data
    out = bytearray(data)
    start = rng.randrange(HEADER.size, len(out))
    for i in range(start, min(len(out), start + rng.randint(1, 32))):
        out[i] = rng.randrange(256)
    return bytes(out)


_MUTATIONS = [_bit_flips, _byte_sets, _truncate, _huge_length, _random_type_and_id, _random_descriptors,
              _random_bytes, _payload_garbage]


def inputs(seed, count, seeds):
    """`count` inputs from `seed`: seeds as they are (1 in 8) or mutated (1 to 3 mutations)."""
    rng = random.Random(seed)
    for _ in range(count):
        data = rng.choice(seeds)
        if rng.random() < 0.125:
            yield data
            continue
        for _ in range(rng.randint(1, 3)):
            mutation = rng.choice(_MUTATIONS + [_splice])
            data = mutation(rng, data, seeds) if mutation is _splice else mutation(rng, data)
            if not data:
                data = b"\0"
        yield data


# ---- the fuzzer process -------------------------------------------------------


class _Peer:
    """An authenticated connection that reconnects when the worker closes it."""

    def __init__(self, address, secret, rank):
        self.address, self.secret, self.rank = address, secret, rank
        self.sock = None
        self.connections = 0

    def send(self, data, fresh_after):
        if self.sock is None:
            self.sock = raw_peer.connect(self.address, self.secret, self.rank)
            self.sock.setblocking(False)
            self.connections += 1
        try:
            view = memoryview(data)
            while view:
                try:
                    view = view[self.sock.send(view):]
                except BlockingIOError:
                    self._drain(wait=0.01)  # the worker answers while we write
            self._drain(wait=0)
        except OSError as exc:  # reset or broken pipe: it closed on us
            if exc.errno not in (errno.ECONNRESET, errno.EPIPE) and not isinstance(exc, ConnectionError):
                raise
            self.close()
            return
        if fresh_after:
            self.close()

    def _drain(self, wait):
        """Reads (and drops) what the worker sent; raises ConnectionError once it closed."""
        if wait:
            import select
            select.select([self.sock], [], [], wait)
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                raise ConnectionError("closed by the worker")

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def run(address, secret, rank, seed, count, seeds, progress=None):
    """Sends `count` inputs; returns the number of connections it took."""
    peer = _Peer(address, secret, rank)
    for i, data in enumerate(inputs(seed, count, seeds)):
        if progress is not None and i % 1000 == 0:
            progress(i)
        # a frame that declares more than it has would swallow the next inputs
        peer.send(data, fresh_after=declared_length(data) != len(data))
    peer.close()
    return peer.connections


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret-hex", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--inputs", type=int, required=True)
    parser.add_argument("--seeds", required=True, help="a pickle of the list of seed frames")
    args = parser.parse_args()
    with open(args.seeds, "rb") as f:
        seeds = pickle.load(f)
    started = time.monotonic()

    def progress(i):
        print(f"input {i} after {time.monotonic() - started:.1f} s", flush=True)

    connections = run((args.host, args.port), bytes.fromhex(args.secret_hex), args.rank, args.seed, args.inputs,
                      seeds, progress)
    print(f"done: {args.inputs} inputs, {connections} connections, {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
