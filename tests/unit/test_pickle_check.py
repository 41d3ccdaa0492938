"""The bounds check of a peer's pickle (csrc/message/pickle_check.*), which
runs before torch's unpickler or Python's trusts a declared length or memo
index."""

import pickle
import struct

import pytest
import torch

from torchrpc import callables, python_fallback
from torchrpc._extension import native


def check(data):
    return native().check_pickle(data)


@pytest.mark.parametrize("value", [
    (1, 2.5, "text", b"bytes", None, True), {"a": [1, 2, {"b": (3,)}]}, list(range(1000)), "x" * 100_000,
    [[1.0, 2.0]] * 50, 2 ** 100,
])
def test_pickles_of_every_protocol_pass(value):
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert check(pickle.dumps(value, protocol=protocol)) == ""



def test_a_declared_length_past_the_end_is_refused():
    # BINUNICODE declaring 4 GB in a 10-byte pickle: torch would zero-fill 4 GB first.
    bad = b"\x80\x02X" + struct.pack("<I", 0xFFFFFFF0) + b"ab."
    assert "declares 4294967280 bytes where 3 remain" in check(bad)
    assert "declares" in check(b"\x80\x02\x8e" + struct.pack("<Q", 1 << 60) + b".")  # BINBYTES8


def test_a_memo_index_that_skips_ahead_is_refused():
    # LONG_BINPUT 4e9 on the first put: torch would grow its memo to 4e9 entries.
    bad = b"\x80\x02N" + b"r" + struct.pack("<I", 4_000_000_000) + b"."
    assert "memo index 4000000000 skips ahead" in check(bad)
    # PUT (protocol 0) takes its index in decimal; Python's unpickler grows its memo to it too
    assert "memo index 900000000 skips ahead" in check(b"Np900000000\n.")
    assert "not a number" in check(b"Np-1\n.")
    assert check(b"Np0\ng0\n.") == ""


# LONG_BINPUT 101317043, as the wire fuzzer made it from a call's pickle: Python's
# unpickler took 1.8 s and 1.6 GB to grow its memo before it met the garbage after it.
_MEMO_BOMB = b"\x80\x05N" + b"r" + struct.pack("<I", 101_317_043) + b"."


def test_pythons_unpickler_never_reads_a_refused_pickle():
    with pytest.raises(pickle.UnpicklingError, match="a peer's pickle: pickle memo index 101317043 skips ahead"):
        python_fallback.loads(_MEMO_BOMB, [])
    with pytest.raises(pickle.UnpicklingError, match="the pickle of 'f': pickle memo index"):
        callables.load_function(_MEMO_BOMB, "f")
    with pytest.raises(pickle.UnpicklingError, match="the copy of .no_such_function_here.: pickle declares"):
        callables._MainReference("no_such_function_here", b"\x80\x05\x8e" + struct.pack("<Q", 1 << 40) + b".", None).resolve()
    assert python_fallback.loads(pickle.dumps((1, "two", [3.0]), protocol=5), []) == (1, "two", [3.0])


@pytest.mark.parametrize("data, why", [
    (b"\x80\x02\xff.", "unsupported pickle opcode"),
    (b"\x80\x02N", "ends without STOP"),
    (b"\x80\x02N.N", "after its STOP"),
    (b"\x80\x02J\x01", "ends inside an argument"),
    (b"\x80\x02X\x01", "ends inside a length"),
    (b"\x80\x02cos\nsys", "ends inside a line argument"),
])
def test_truncated_or_foreign_pickles_are_refused(data, why):
    assert why in check(data)


# ---- the values torch's unpickler would build (checkPickle's torchValues) ----

def _decode(payload):
    from tests.csrc import hooks

    return hooks().decode_payload(payload, [])


def _nested(depth):
    """Protocol 2: `depth` empty lists pushed, then each appended into the one below."""
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def test_values_nested_to_the_cap_decode_and_deeper_are_refused():
    # 100,000 nested lists (200 KB) crashed the decoding thread with a stack overflow.
    value, _ = _decode(_nested(1000))
    depth = 0
    while isinstance(value, list) and value:
        value, depth = value[0], depth + 1
    assert depth == 999
    for depth in (1001, 100_000):
        with pytest.raises(RuntimeError, match="pickle nests values over 1000 levels deep"):
            _decode(_nested(depth))


def test_a_chain_through_the_memo_is_followed():
    # Each list appended into the last one fetched from the memo: the stack
    # stays two deep while the value nests 5,000 levels.
    payload = b"\x80\x02]q\x00" + b"".join(
        b"h" + bytes([i % 2]) + b"]q" + bytes([(i + 1) % 2]) + b"a0" for i in range(5000)) + b"N."
    with pytest.raises(RuntimeError, match="pickle nests values over 1000 levels deep"):
        _decode(payload)


def test_a_value_that_contains_itself_or_grows_a_call_result_is_refused():
    with pytest.raises(RuntimeError, match="contains itself"):
        _decode(b"\x80\x02]q\x00h\x00a.")
    grown = b"\x80\x02ctorch.jit._pickle\nrestore_type_tag\n](X\x09\x00\x00\x00List[int]\x86R]a."
    with pytest.raises(RuntimeError, match="adds to what a call returned"):
        _decode(grown)


def test_what_torchs_pickler_writes_decodes():
    from tests.csrc import hooks

    for value, type_ in [({"a": [[1, 2], [3]], "b": (1.5, "x")}, "Dict[str, Any]"), ([[[1]]] * 3, ""),
                         ((torch.ones(2), [torch.zeros(1)] * 2), "")]:
        payload, tensors = hooks().encode_payload(value, type_)
        assert hooks().decode_payload(payload, tensors)[0] is not None
