"""The frame format and its parser (csrc/message/wire.*), through test hooks.
How each tensor layout travels (tensor_layout.*): test_tensor_layout.py.

Every malformed input must yield an error for that stream (never a crash, a
hang or an allocation driven by an unchecked length).
"""

import struct

import pytest
import torch

from tests.csrc import hooks
from tests.multiprocess import raw_peer
from torchrpc._extension import native

C = native()
SCRIPT_RET = 20
HEADER = struct.Struct("<IHHQQII")  # magic, version, type, id, payloadLen, numTensors, descLen
MAGIC = raw_peer.FRAME_MAGIC


def frame(payload=b"", tensors=(), type_=SCRIPT_RET, id_=7, lend_from=0):
    return hooks().encode_frame(type_, id_, payload, list(tensors), lend_from)


def parse_with_lent(data, chunk=1 << 20, **limits):
    """(messages as (type, id, payload, tensors, lent), error, mid-frame)."""
    return hooks().parse_frames(data, chunk, **limits)


def parse(data, chunk=1 << 20, **limits):
    """(messages as (type, id, payload, tensors), error, mid-frame): no lent tensors."""
    messages, error, mid = parse_with_lent(data, chunk, **limits)
    assert all(not m[4] for m in messages)
    return [m[:4] for m in messages], error, mid


ALL_DTYPES = [
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.float32, torch.float64, torch.complex64, torch.complex128, torch.bool,
    torch.bfloat16, torch.uint16, torch.uint32, torch.uint64,
]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_round_trip_every_dtype(dtype):
    t = (torch.arange(12) % 5).to(dtype).reshape(3, 4)
    messages, error, mid = parse(frame(b"abc", [t]))
    assert error == "" and not mid
    [(type_, id_, payload, tensors)] = messages
    assert (type_, id_, payload) == (SCRIPT_RET, 7, b"abc")
    assert tensors[0].dtype == dtype and torch.equal(tensors[0], t)


@pytest.mark.parametrize("chunk", [1, 3, 31, 32, 33, 4096, 1 << 20])
def test_any_chunking_gives_the_same_messages(chunk):
    ts = [torch.randn(5, 7), torch.empty(0, 3), torch.tensor(3.5), torch.randint(0, 9, (100_000,))]
    data = frame(b"first", ts) + frame(b"", [], id_=8) + frame(b"x" * 1000, ts[:1], id_=9)
    messages, error, mid = parse(data, chunk)
    assert error == "" and not mid
    assert [m[1] for m in messages] == [7, 8, 9]
    for got, want in zip(messages[0][3], ts):
        assert got.shape == want.shape and torch.equal(got, want)
    assert messages[2][2] == b"x" * 1000


def test_truncated_frame_is_incomplete_not_an_error():
    data = frame(b"payload", [torch.ones(100)])
    for cut in (1, 31, 32, 40, len(data) - 1):
        messages, error, mid = parse(data[:cut])
        assert messages == [] and error == "" and mid


def corrupt(data, **fields):
    values = dict(zip(("magic", "version", "type", "id", "payload", "ntensors", "desc"), HEADER.unpack(data[:32])))
    values.update(fields)
    return HEADER.pack(*values.values()) + data[32:]


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(magic=0xDEADBEEF), "bad frame magic"),
        (dict(version=99), "unsupported wire version 99"),
        # The build before the compact payloads (plain_codec): its values would not decode.
        (dict(version=4), "unsupported wire version 4 (this build speaks 5): every worker must run the same"),
        (dict(type=999), "unknown message type 999"),
        (dict(payload=1 << 40), "payload length"),
        (dict(ntensors=1 << 20), "tensors; the limit is"),
        (dict(desc=3), "descriptor length 3"),
    ],
)
def test_bad_header_fields_are_rejected(fields, message):
    messages, error, _ = parse(corrupt(frame(b"p", [torch.ones(2)]), **fields))
    assert messages == []
    assert message in error


def descriptor_offset(payload_len):
    return 32 + payload_len


def test_bad_tensor_descriptors_are_rejected():
    good = bytearray(frame(b"", [torch.ones(2, 3)]))
    off = descriptor_offset(0)
    cases = []
    bad = bytearray(good); bad[off] = 200; cases.append((bad, "unsupported dtype code 200"))
    bad = bytearray(good); bad[off] = int(12); cases.append((bad, "unsupported dtype code 12"))  # quantized
    bad = bytearray(good); struct.pack_into("<q", bad, off + 8, -4); cases.append((bad, "negative size"))
    bad = bytearray(good); struct.pack_into("<Q", bad, off + 24, 999); cases.append((bad, "claims 999 bytes"))
    bad = bytearray(good); struct.pack_into("<q", bad, off + 8, 1 << 62); cases.append((bad, "1 TB limit"))
    for data, message in cases:
        messages, error, _ = parse(bytes(data))
        assert messages == [] and message in error, (message, error)


def test_a_frame_over_the_message_cap_is_refused_before_allocation():
    # Payload and tensors count together; the error names the option to raise.
    data = frame(b"x" * 100, [torch.ones(100)])
    assert parse(data, max_frame_bytes=len(data))[1] == ""
    messages, error, _ = parse(data, max_frame_bytes=200)
    assert messages == [] and "declares at least" in error and "max_message_bytes" in error
    # A declared payload alone is refused from the header, before its bytes come.
    messages, error, _ = parse(corrupt(frame(b"p"), payload=1 << 30)[:32], max_frame_bytes=1 << 20)
    assert messages == [] and "max_message_bytes" in error


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def declare_float_tensor(numel, id_=7):
    """A frame's header and descriptor for one float32 tensor of numel elements (no data)."""
    desc = struct.pack("<BBHB3xqQ", 6, 1, 0, 0, numel, numel * 4)  # float32, 1 dim, no flags, strided
    return HEADER.pack(MAGIC, raw_peer.WIRE_VERSION, SCRIPT_RET, id_, 0, 1, len(desc)) + desc


def test_a_declared_tensor_costs_memory_only_as_its_bytes_arrive():
    # A 1 GiB tensor declared, 32 MiB of it sent: the reader holds about what
    # arrived, not the declaration (the rest is never faulted in).
    sent = declare_float_tensor(1 << 28) + b"\0" * (32 << 20)
    before = rss_bytes()
    held, error = hooks().hold_partial_frame(sent)
    grown = rss_bytes() - before
    assert error == ""
    assert grown < 200 << 20, f"holding a 1 GiB declaration with 32 MiB sent grew RSS by {grown >> 20} MiB"
    del held


def overcommit_mode():
    with open("/proc/sys/vm/overcommit_memory") as f:
        return f.read().strip()


@pytest.mark.skipif(overcommit_mode() == "1",
                    reason="vm.overcommit_memory=1: any mapping succeeds, so none fails to test")
def test_an_allocation_that_fails_is_an_error_of_the_stream():
    # 512 GiB declared under a cap that allows it, and its first byte sent: the
    # memory cannot be had, and the reader says so instead of throwing.
    messages, error, _ = parse(declare_float_tensor(1 << 37) + b"\0", max_frame_bytes=1 << 50)
    assert messages == [] and "cannot allocate" in error


def test_good_frames_before_a_bad_one_are_delivered():
    data = frame(b"ok", id_=1) + corrupt(frame(b"bad", id_=2), magic=1)
    messages, error, _ = parse(data)
    assert [m[1] for m in messages] == [1]
    assert "bad frame magic" in error


def test_unsupported_tensors_are_refused_on_send():
    # Layouts and dtypes (tests/unit/test_tensor_layout.py has what travels).
    with pytest.raises(RuntimeError, match="tensor #1: its layout .* is neither strided nor sparse"):
        frame(b"", [torch.ones(2), torch.ones(2, 2).to_mkldnn()])
    with pytest.raises(RuntimeError, match="cannot send tensors of dtype Float8_e4m3fnuz"):
        frame(b"", [torch.empty(2, dtype=torch.float8_e4m3fnuz)])


def test_large_received_tensors_reuse_freed_memory_never_live_memory():
    # Tensors of 4 MB and more are read into memory that received tensors
    # left behind (csrc/message/receive_buffers.h).
    n = (6 << 20) // 4
    data = frame(tensors=[torch.full((n,), 1.0), torch.arange(n, dtype=torch.float32)])
    (_, _, _, (a, b)), = parse(data)[0]
    assert torch.equal(a, torch.full((n,), 1.0)) and torch.equal(b, torch.arange(n, dtype=torch.float32))
    assert a.data_ptr() != b.data_ptr()
    before = C.debug_counters()["receive_cache_bytes"]
    del a
    assert C.debug_counters()["receive_cache_bytes"] > before  # kept, not returned to the system
    (_, _, _, (c, d)), = parse(data)[0]
    assert C.debug_counters()["receive_cache_bytes"] == before  # ... and taken again
    assert torch.equal(c, torch.full((n,), 1.0)) and torch.equal(d, torch.arange(n, dtype=torch.float32))
    assert torch.equal(b, torch.arange(n, dtype=torch.float32))  # a live one is never reused
    # such a tensor behaves like any other: it resizes and frees normally
    c.resize_(2 * n)
    c[n:] = 3.0
    assert torch.equal(c[:n], torch.full((n,), 1.0)) and bool((c[n:] == 3.0).all())
    del b, c, d


# ---- lent tensors (transport/same_host.h) -------------------------------------

def test_lent_tensors_travel_as_their_address():
    big, small = torch.arange(100_000.0), torch.ones(3)  # 400 KB and 12 bytes
    data = frame(b"p", [big, small], lend_from=256 << 10)
    assert len(data) == len(frame(b"p", [torch.empty(100_000), small], lend_from=1 << 30)) - big.nbytes + 8
    [(_, _, payload, (got_big, got_small), lent)], error, mid = parse_with_lent(data, chunk=5)
    assert error == "" and not mid and payload == b"p"
    assert lent == [(0, big.data_ptr())]  # the receiver copies it from there
    assert got_big.shape == big.shape and got_big.dtype == big.dtype
    assert torch.equal(got_small, small)
    # below the threshold everything is written into the frame
    [(_, _, _, (whole, _), lent)], _, _ = parse_with_lent(frame(b"p", [big, small], lend_from=1 << 30))
    assert lent == [] and torch.equal(whole, big)


def test_bad_lent_descriptors_are_rejected():
    good = bytearray(frame(b"", [torch.ones(1 << 16)], lend_from=1))
    off = descriptor_offset(0)
    cases = []
    bad = bytearray(good); struct.pack_into("<H", bad, off + 2, 6); cases.append((bad, "unknown flags 0x6"))
    bad = bytearray(good); struct.pack_into("<Q", bad, off + 24, 0); cases.append((bad, "no memory to copy"))
    short = bytearray(good[:-8]); struct.pack_into("<I", short, 28, HEADER.unpack(good[:32])[6] - 8)
    cases.append((short, "truncated address of lent tensor #0"))
    for data, message in cases:
        messages, error, _ = parse_with_lent(bytes(data))
        assert messages == [] and message in error, (message, error)
