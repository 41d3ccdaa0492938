"""How tensors of every layout travel (csrc/message/tensor_layout.*), through
the wire's test hooks: strided tensors keep their strides and send only the
bytes their elements span; sparse tensors travel as their components, never
densified; and a hostile descriptor or a component that breaks a sparse
layout's invariants is an error of the stream, never a crash or an invalid
tensor.
"""

import random
import struct

import pytest
import torch

from tests.multiprocess import raw_peer
from tests.multiprocess.layout_funcs import components
from tests.unit.test_wire import HEADER, MAGIC, SCRIPT_RET, frame, parse, parse_with_lent

DESC = struct.Struct("<BBHB3x")  # dtype, ndim, flags, layout code, 3 reserved bytes
LENT, STRIDES, COALESCED = 1, 2, 4
STRIDED, COO, CSR, CSC, BSR, BSC, SHARED = range(7)
BYTE, FLOAT, LONG, INT = 0, 6, 4, 3  # c10::ScalarType codes


def round_trip(*tensors, **kw):
    messages, error, mid = parse(frame(b"", tensors, **kw))
    assert error == "" and not mid
    return messages[0][3]


def data_bytes(data):
    """Bytes of a one-message frame after its header, payload and descriptors."""
    _, _, _, _, payload_len, _, desc_len = HEADER.unpack_from(data)
    return len(data) - HEADER.size - payload_len - desc_len


# ---- strided ---------------------------------------------------------------------


def test_a_transposed_tensor_arrives_with_its_strides_and_its_bytes_only():
    x = torch.arange(12.0).reshape(3, 4)
    [got] = round_trip(x.t())
    assert got.stride() == x.t().stride() and torch.equal(got, x.t())
    assert data_bytes(frame(b"", [x.t()])) == x.nbytes


def test_a_narrow_view_of_a_small_tensor_arrives_non_contiguous():
    # upstream's test_non_cont_tensors: the view keeps its layout
    t = torch.rand(5, 5)
    view = t.narrow(1, 2, 2)
    [got] = round_trip(view)
    assert not got.is_contiguous() and got.stride() == (5, 1) and torch.equal(got, view)
    assert got.storage_offset() == 0 and got._base is None  # its own memory, not a view of a buffer


def test_a_slice_of_a_large_tensor_sends_only_its_elements():
    big = torch.rand(1000, 1000)
    column, rows = big[:, 3], big[10:20]
    assert data_bytes(frame(b"", [column])) == column.numel() * 4  # contiguous copy
    assert data_bytes(frame(b"", [rows])) == rows.numel() * 4  # a contiguous view: its bytes
    got_column, got_rows = round_trip(column, rows)
    assert got_column.is_contiguous() and torch.equal(got_column, column)
    assert torch.equal(got_rows, rows) and got_rows.untyped_storage().nbytes() == rows.nbytes


def test_expanded_and_channels_last_tensors_keep_their_layout():
    expanded = torch.arange(3.0).expand(1000, 3)
    image = torch.rand(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert data_bytes(frame(b"", [expanded])) == 3 * 4  # its three elements, not 3000
    got_expanded, got_image = round_trip(expanded, image)
    assert got_expanded.stride() == (0, 1) and torch.equal(got_expanded, expanded)
    assert got_image.is_contiguous(memory_format=torch.channels_last) and torch.equal(got_image, image)


def test_a_received_strided_tensor_is_a_plain_tensor():
    [got] = round_trip(torch.arange(12.0).reshape(3, 4).t())
    got.add_(1)  # writable, owns its memory
    got.requires_grad_(True)  # a leaf: the Python fallback sets requires_grad like this
    assert got.is_leaf and torch.equal(got.detach(), torch.arange(12.0).reshape(3, 4).t() + 1)


def test_a_lent_strided_tensor_is_its_span_at_its_address():
    x = torch.arange(100_000.0).reshape(1000, 100).t()
    [(_, _, _, (got,), lent)], error, _ = parse_with_lent(frame(b"", [x], lend_from=1024))
    assert error == "" and lent == [(0, x.data_ptr())]
    assert got.stride() == x.stride()


# ---- sparse --------------------------------------------------------------------


def coo(coalesce=False, dtype=torch.float32):
    t = torch.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3.0, 4.0, 5.0], (2, 3), dtype=dtype, check_invariants=True)
    return t.coalesce() if coalesce else t


def dense(n=6):
    x = torch.zeros(n, n)
    x[0, 1], x[2, 2], x[3, 0], x[5, 4] = 1.0, 2.0, 3.0, 4.0
    return x


SPARSE = {
    "coo": lambda: coo(),
    "coo_coalesced": lambda: coo(coalesce=True),
    "coo_double": lambda: coo(dtype=torch.float64),
    "coo_hybrid": lambda: torch.rand(4, 3, 2).to_sparse(sparse_dim=2),
    "coo_empty": lambda: torch.zeros(3, 4).to_sparse(),
    "csr": lambda: dense().to_sparse_csr(),
    "csr_int32": lambda: torch.sparse_csr_tensor(torch.tensor([0, 1, 2], dtype=torch.int32),
                                                 torch.tensor([1, 0], dtype=torch.int32), torch.tensor([1.0, 2.0]),
                                                 (2, 2), check_invariants=True),
    "csr_batched": lambda: torch.stack([dense(), 2 * dense()]).to_sparse_csr(),
    "csc": lambda: dense().to_sparse_csc(),
    "bsr": lambda: dense().to_sparse_bsr((2, 2)),
    "bsc": lambda: dense().to_sparse_bsc((3, 2)),
}


@pytest.mark.parametrize("make", SPARSE.values(), ids=SPARSE.keys())
def test_sparse_tensors_arrive_as_they_were_sent(make):
    t = make()
    [got] = round_trip(t)
    assert got.layout == t.layout and got.dtype == t.dtype and got.shape == t.shape
    if t.layout == torch.sparse_coo:
        assert got.is_coalesced() == t.is_coalesced()
    for mine, theirs in zip(components(got), components(t)):
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)
    assert torch.equal(got.to_dense(), t.to_dense())


def test_a_sparse_tensor_travels_as_its_components_not_densified():
    t = torch.sparse_coo_tensor([[0, 9999], [5, 9999]], [1.0, 2.0], (10_000, 10_000), check_invariants=True)
    assert data_bytes(frame(b"", [t])) == 4 * 8 + 2 * 4  # indices and values: 40 bytes, not 400 MB
    [got] = round_trip(t)
    assert got.is_sparse and torch.equal(got._values(), t._values())


def test_a_sparse_tensor_that_requires_grad_travels_detached():
    t = coo().requires_grad_(True)
    [got] = round_trip(t)
    assert not got.requires_grad and torch.equal(got.to_dense(), t.detach().to_dense())


def test_large_sparse_components_are_lent():
    values = torch.arange(100_000.0)
    t = torch.sparse_coo_tensor(torch.arange(100_000).unsqueeze(0), values, (100_000,), check_invariants=True)
    [(_, _, _, (got,), lent)], error, _ = parse_with_lent(frame(b"", [t], lend_from=256 << 10))
    assert error == "" and lent == [(0, t._indices().data_ptr()), (1, t._values().data_ptr())]
    assert got.is_sparse and got.shape == t.shape


def test_an_invalid_sparse_tensor_is_refused_on_send():
    bad = torch.sparse_coo_tensor([[0, 7]], [1.0, 2.0], (3,), check_invariants=False)
    with pytest.raises(RuntimeError, match=r"cannot send tensor #0, an invalid torch.sparse_coo tensor: .*size is 3"):
        frame(b"", [bad])


# ---- hostile descriptors -----------------------------------------------------------


def strided_desc(dtype, sizes, data, strides=None, flags=0):
    desc = DESC.pack(dtype, len(sizes), flags | (STRIDES if strides is not None else 0), STRIDED)
    desc += struct.pack(f"<{len(sizes)}q", *sizes)
    if strides is not None:
        desc += struct.pack(f"<{len(strides)}q", *strides)
    return desc + struct.pack("<Q", len(data))


def hand_frame(descs, buffers):
    """A SCRIPT_RET frame of these tensor descriptors and buffer bytes."""
    desc = b"".join(descs)
    return HEADER.pack(MAGIC, raw_peer.WIRE_VERSION, SCRIPT_RET, 7, 0, len(descs), len(desc)) + desc + b"".join(buffers)


def sparse_desc(code, dtype, sizes, parts, flags=0):
    """(descriptor, buffers) of a sparse tensor; parts are (dtype, sizes, data)."""
    desc = DESC.pack(dtype, len(sizes), flags, code) + struct.pack(f"<{len(sizes)}q", *sizes)
    return desc + b"".join(strided_desc(*p) for p in parts), [p[2] for p in parts]


def longs(*v):
    return struct.pack(f"<{len(v)}q", *v)


def floats(*v):
    return struct.pack(f"<{len(v)}f", *v)


def ints(*v):
    return struct.pack(f"<{len(v)}i", *v)


def sparse_frame(*args, **kw):
    desc, buffers = sparse_desc(*args, **kw)
    return hand_frame([desc], buffers)


def test_the_coalesced_flag_is_checked_as_torch_orders_entries():
    # row-major order of the index tuples, strictly increasing; a hybrid tensor's dense part aside
    ok = sparse_frame(COO, FLOAT, [3, 3, 2], [(LONG, [2, 3], longs(0, 1, 1, 2, 0, 1)), (FLOAT, [3, 2], floats(*range(6)))],
                      flags=COALESCED)
    [got] = parse(ok)[0][0][3]
    assert got.is_coalesced() and torch.equal(got.to_dense(), got.coalesce().to_dense())
    torch._validate_sparse_coo_tensor_args(got._indices(), got._values(), got.shape, True)


def test_hand_built_sparse_frames_parse():
    # the builders above speak the format: a COO and a CSR tensor
    [got] = parse(sparse_frame(COO, FLOAT, [2, 3], [(LONG, [2, 2], longs(0, 1, 2, 0)), (FLOAT, [2], floats(1, 2))]))[0][0][3]
    assert torch.equal(got.to_dense(), torch.tensor([[0.0, 0, 1], [2, 0, 0]]))
    [got] = parse(sparse_frame(CSR, FLOAT, [2, 2], [(INT, [3], ints(0, 1, 2)), (INT, [2], ints(1, 0)),
                                                     (FLOAT, [2], floats(1, 2))]))[0][0][3]
    assert torch.equal(got.to_dense(), torch.tensor([[0.0, 1], [2, 0]]))


BAD_SPARSE = {
    "index out of range": (sparse_frame(COO, FLOAT, [2, 3], [(LONG, [2, 1], longs(5, 0)), (FLOAT, [1], floats(1))]),
                           "is not a valid torch.sparse_coo tensor"),
    "negative index": (sparse_frame(COO, FLOAT, [2, 3], [(LONG, [2, 1], longs(-1, 0)), (FLOAT, [1], floats(1))]),
                       "is not a valid torch.sparse_coo tensor"),
    "falsely coalesced": (sparse_frame(COO, FLOAT, [2, 3], [(LONG, [2, 2], longs(1, 0, 0, 0)),
                                                            (FLOAT, [2], floats(1, 2))], flags=COALESCED),
                          "uncoalesced"),
    "duplicate entries claimed coalesced": (sparse_frame(COO, FLOAT, [2, 3], [(LONG, [2, 2], longs(1, 1, 2, 2)),
                                                                              (FLOAT, [2], floats(1, 2))],
                                                         flags=COALESCED), "uncoalesced"),
    "nnz mismatch": (sparse_frame(COO, FLOAT, [2, 3], [(LONG, [2, 2], longs(0, 1, 0, 0)), (FLOAT, [1], floats(1))]),
                     "is not a valid torch.sparse_coo tensor"),
    "1-d indices": (sparse_frame(COO, FLOAT, [3], [(LONG, [1], longs(0)), (FLOAT, [1], floats(1))]),
                    "is not a valid torch.sparse_coo tensor"),
    "dims mismatch": (sparse_frame(COO, FLOAT, [2, 3, 4], [(LONG, [2, 1], longs(0, 0)), (FLOAT, [1], floats(1))]),
                      "is not a valid torch.sparse_coo tensor"),
    "int32 coo indices": (sparse_frame(COO, FLOAT, [2], [(INT, [1, 1], ints(0)), (FLOAT, [1], floats(1))]),
                          "indices of tensor #0 are not int64"),
    "values dtype": (sparse_frame(COO, FLOAT, [2], [(LONG, [1, 1], longs(0)), (LONG, [1], longs(1))]),
                     "values of tensor #0 are Long; its descriptor says Float"),
    "crow not monotone": (sparse_frame(CSR, FLOAT, [2, 2], [(LONG, [3], longs(0, 2, 1)), (LONG, [1], longs(0)),
                                                            (FLOAT, [1], floats(1))]),
                          "is not a valid torch.sparse_csr tensor"),
    "crow last != nnz": (sparse_frame(CSR, FLOAT, [2, 2], [(LONG, [3], longs(0, 1, 5)), (LONG, [1], longs(0)),
                                                           (FLOAT, [1], floats(1))]),
                         "is not a valid torch.sparse_csr tensor"),
    "col out of range": (sparse_frame(CSR, FLOAT, [2, 2], [(LONG, [3], longs(0, 1, 1)), (LONG, [1], longs(9)),
                                                           (FLOAT, [1], floats(1))]),
                         "is not a valid torch.sparse_csr tensor"),
    "mixed index dtypes": (sparse_frame(CSR, FLOAT, [2, 2], [(LONG, [3], longs(0, 1, 1)), (INT, [1], ints(0)),
                                                             (FLOAT, [1], floats(1))]),
                           "are not both int32 or both int64"),
    "float indices": (sparse_frame(CSC, FLOAT, [2, 2], [(FLOAT, [3], floats(0, 1, 1)), (FLOAT, [1], floats(0)),
                                                        (FLOAT, [1], floats(1))]),
                      "are not both int32 or both int64"),
    "bad blocks": (sparse_frame(BSR, FLOAT, [4, 4], [(LONG, [3], longs(0, 1, 1)), (LONG, [1], longs(0)),
                                                     (FLOAT, [1, 3, 2], floats(*range(6)))]),
                   "is not a valid torch.sparse_bsr tensor"),
    "coalesced flag on csr": (sparse_frame(CSR, FLOAT, [1, 1], [(LONG, [2], longs(0, 0)), (LONG, [0], b""),
                                                                (FLOAT, [0], b"")], flags=COALESCED),
                              "unknown flags 0x4"),
    "nested sparse component": (hand_frame([DESC.pack(FLOAT, 1, 0, COO) + longs(2) + DESC.pack(LONG, 0, 0, COO)], []),
                                "indices of tensor #0 has layout code 1 where a strided tensor belongs"),
    "unknown layout": (hand_frame([DESC.pack(FLOAT, 1, 0, 9) + longs(2)], []), "unknown layout code 9"),
    "shape overflows int64": (sparse_frame(COO, FLOAT, [1 << 40, 1 << 40], [(LONG, [2, 0], b""), (FLOAT, [0], b"")]),
                              "more elements than an int64 counts"),
    "negative sparse size": (sparse_frame(COO, FLOAT, [-2], [(LONG, [1, 0], b""), (FLOAT, [0], b"")]),
                             "negative size -2"),
    "truncated component": (hand_frame([DESC.pack(FLOAT, 1, 0, COO) + longs(2)], []),
                            "truncated descriptor of indices of tensor #0"),
}


@pytest.mark.parametrize("data, message", BAD_SPARSE.values(), ids=BAD_SPARSE.keys())
def test_hostile_sparse_descriptors_are_errors_of_the_stream(data, message):
    messages, error, _ = parse(data)
    assert messages == [] and message in error, error


BAD_STRIDED = {
    "negative stride": (strided_desc(FLOAT, [2, 2], floats(*range(4)), strides=[-1, 1]), "negative stride -1"),
    "strides on an empty tensor": (strided_desc(FLOAT, [0, 2], b"", strides=[2, 1]), "is empty but has strides"),
    "span beyond 1 TB": (strided_desc(FLOAT, [2, 2], floats(1), strides=[1 << 62, 1]), "span more than the 1 TB"),
    "bytes not the span": (strided_desc(FLOAT, [2, 2], floats(*range(4)), strides=[2, 2]), "need 20"),
    "expanded beyond 1 TB": (strided_desc(FLOAT, [1 << 40, 1], floats(1), strides=[0, 1]), "1 TB limit"),
    "reserved bytes": (DESC.pack(FLOAT, 0, 0, 0)[:5] + b"\x01\0\0" + longs(4), "nonzero reserved bytes"),
    "unknown flags": (strided_desc(FLOAT, [1], floats(1), flags=8), "unknown flags 0x8"),
}


@pytest.mark.parametrize("desc, message", BAD_STRIDED.values(), ids=BAD_STRIDED.keys())
def test_hostile_strided_descriptors_are_errors_of_the_stream(desc, message):
    messages, error, _ = parse(hand_frame([desc], [b"\0" * 64]))
    assert messages == [] and message in error, error


def test_a_strided_descriptor_that_fits_its_span_is_accepted():
    # the same fields as above, agreeing: a 2x2 view over 3 elements (strides 1, 1)
    [got] = parse(hand_frame([strided_desc(FLOAT, [2, 2], floats(0, 1, 2), strides=[1, 1])], [floats(0, 1, 2)]))[0][0][3]
    assert got.stride() == (1, 1) and torch.equal(got, torch.tensor([[0.0, 1], [1, 2]]))


# ---- tensors that share memory -----------------------------------------------------


def test_a_tensor_and_its_view_arrive_sharing_memory():
    x = torch.arange(6.0)
    a, b = round_trip(x, x[2:4])
    assert torch.equal(a, x) and torch.equal(b, x[2:4])
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and b.storage_offset() == 2
    b.add_(100)  # as upstream: an in-place change of one shows in the other
    assert torch.equal(a, torch.tensor([0.0, 1, 102, 103, 4, 5]))
    assert data_bytes(frame(b"", [x, x[2:4]])) == x.nbytes  # the memory travels once


def test_the_same_tensor_twice_and_views_of_other_dtypes_share_one_memory():
    y = torch.arange(8, dtype=torch.float64)
    same1, same2, doubles, floats_view = round_trip(y, y, y[1:3], y.view(torch.float32)[3:7])
    assert same1.untyped_storage().data_ptr() == same2.untyped_storage().data_ptr() == doubles.untyped_storage().data_ptr()
    assert torch.equal(doubles, y[1:3]) and torch.equal(floats_view, y.view(torch.float32)[3:7])
    assert floats_view.untyped_storage().data_ptr() == same1.untyped_storage().data_ptr()
    # only the bytes they use, from a 16-byte boundary: the middle of a larger tensor
    big = torch.arange(1000.0)
    a, b = round_trip(big[101:103], big[102:105].view(3, 1))
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert data_bytes(frame(b"", [big[101:103], big[102:105]])) == 4 * 4 + 4  # bytes 400..420 of big


def test_views_far_apart_in_a_large_tensor_travel_on_their_own():
    big = torch.rand(1000, 1000)
    first, last = big[0, :10], big[999, :10]
    assert data_bytes(frame(b"", [first, last])) == 2 * 10 * 4  # not the 4 MB between them
    a, b = round_trip(first, last)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr() and torch.equal(b, last)


def shared_desc(dtype, sizes, strides, owner, offset, reserved=0, flags=0, memory=None):
    """A shared view's descriptor; `memory` (bytes): this tensor carries it."""
    desc = DESC.pack(dtype, len(sizes), flags, SHARED) + struct.pack("<IIQ", owner, reserved, offset)
    desc += struct.pack(f"<{len(sizes)}q", *sizes) + struct.pack(f"<{len(strides)}q", *strides)
    return desc + (strided_desc(BYTE, [len(memory)], memory) if memory is not None else b"")


MEMORY = floats(*range(8))  # 32 bytes


def test_hand_built_shared_frames_parse():
    owner = shared_desc(FLOAT, [8], [1], 0, 0, memory=MEMORY)
    view = shared_desc(FLOAT, [2, 2], [1, 2], 0, 8)  # elements 2.. as a 2x2 with strides (1, 2)
    a, b = parse(hand_frame([owner, view], [MEMORY]))[0][0][3]
    assert torch.equal(b, torch.tensor([[2.0, 4], [3, 5]])) and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


BAD_SHARED = {
    "view beyond its memory": ([shared_desc(FLOAT, [8], [1], 0, 0, memory=MEMORY), shared_desc(FLOAT, [3], [1], 0, 24)],
                               "uses bytes 24 to 36 of memory that has 32"),
    "strides beyond its memory": ([shared_desc(FLOAT, [2], [100], 0, 0, memory=MEMORY)], "of memory that has 32"),
    "offset past the end": ([shared_desc(FLOAT, [1], [1], 0, 1 << 63, memory=MEMORY)], "of memory that has 32"),
    "misaligned view": ([shared_desc(FLOAT, [1], [1], 0, 2, memory=MEMORY)], "not a multiple of its 4-byte elements"),
    "owner after it": ([shared_desc(FLOAT, [1], [1], 1, 0), shared_desc(FLOAT, [1], [1], 1, 0, memory=MEMORY)],
                       "shares the memory of tensor #1, which comes after it"),
    "owner carries none": ([strided_desc(FLOAT, [1], floats(1)), shared_desc(FLOAT, [1], [1], 0, 0)],
                           "shares the memory of tensor #0, which carries none"),
    "owner is a view": ([shared_desc(FLOAT, [8], [1], 0, 0, memory=MEMORY), shared_desc(FLOAT, [1], [1], 0, 0),
                         shared_desc(FLOAT, [1], [1], 1, 0)], "shares the memory of tensor #1, which carries none"),
    "memory not bytes": ([shared_desc(FLOAT, [1], [1], 0, 0) + strided_desc(FLOAT, [8], MEMORY)],
                         "memory of tensor #0 is not a byte buffer"),
    "reserved bytes": ([shared_desc(FLOAT, [1], [1], 0, 0, reserved=1, memory=MEMORY)], "nonzero reserved bytes"),
    "unknown flags": ([shared_desc(FLOAT, [1], [1], 0, 0, flags=LENT, memory=MEMORY)], "unknown flags 0x1"),
    "strides beyond 1 TB": ([shared_desc(FLOAT, [2], [1 << 62], 0, 0, memory=MEMORY)], "span more than the 1 TB"),
    "truncated": ([DESC.pack(FLOAT, 1, 0, SHARED) + b"\0" * 10], "truncated descriptor of tensor #0"),
}


@pytest.mark.parametrize("descs, message", BAD_SHARED.values(), ids=BAD_SHARED.keys())
def test_hostile_shared_descriptors_are_errors_of_the_stream(descs, message):
    messages, error, _ = parse(hand_frame(descs, [MEMORY]))
    assert messages == [] and message in error, error


def test_mutated_shared_frames_never_crash():
    # Random bytes in the descriptors of valid frames of shared views: each
    # parse either fails or yields tensors whose every element can be read.
    x = torch.arange(64.0)
    seeds = [frame(b"", [x, x[2:9], x.view(8, 8).t()]), frame(b"", [x[3:40], x.view(torch.int32)[10:30], x[5:6]])]
    rng = random.Random(23)
    accepted = 0
    for _ in range(1500):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(HEADER.size, len(data) - 64)
            data[i] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xFF, rng.randrange(256), data[i] ^ (1 << rng.randrange(8))])
        messages, error, _ = parse(bytes(data), chunk=rng.choice([7, 1 << 20]))
        for m in messages:
            for t in m[3]:
                accepted += 1
                if t.numel() < 1 << 22:
                    t.clone()  # reads every element: would crash on a view outside its memory
    assert accepted > 0


def test_mutated_sparse_frames_never_crash_or_make_invalid_tensors():
    # Random bytes in the descriptors and components of valid sparse frames:
    # each parse either fails or yields tensors torch accepts as valid.
    seeds = [frame(b"", [make()]) for make in SPARSE.values()]
    rng = random.Random(22)
    accepted = 0
    for _ in range(1500):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(HEADER.size, len(data))
            data[i] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xFF, rng.randrange(256), data[i] ^ (1 << rng.randrange(8))])
        messages, error, _ = parse(bytes(data), chunk=rng.choice([7, 1 << 20]))
        for m in messages:
            for t in m[3]:
                accepted += 1
                if t.numel() < 1 << 20:  # a mutated size may make a valid sparse tensor huge
                    t.to_dense()  # would crash or raise on a tensor that breaks its invariants
                if t.layout == torch.sparse_coo:
                    torch._validate_sparse_coo_tensor_args(t._indices(), t._values(), t.shape, t.is_coalesced())
                elif t.layout != torch.strided:
                    i, j, v = components(t)
                    torch._validate_sparse_compressed_tensor_args(i, j, v, t.shape, t.layout)
    assert accepted > 0  # some mutations (in values) keep a valid tensor
