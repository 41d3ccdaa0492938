"""The TORCHRPC backend's check of upstream's message payloads
(csrc/torch_backend/upstream_payloads.*), which runs before upstream's
decoders read a peer's message: by message type, each pickle it holds (torch's
or Python's, wrapped or not) is checked as message::checkPickle checks ours,
and a message wrapped deeper than upstream wraps one is refused."""

import functools
import pickle
import struct

import pytest
import torch

from tests.csrc import hooks

# LONG_BINPUT 101317043 on the first put: Python's unpickler would grow its memo to that many entries.
MEMO_BOMB = b"\x80\x05N" + b"r" + struct.pack("<I", 101_317_043) + b"."
# A list nested past message::kMaxValueDepth (1000): torch's unpickler recurses once per level.
DEEP = b"\x80\x02" + b"]" * 2000 + b"a" * 1999 + b"."


@functools.cache
def types():
    return hooks().upstream_message_types()


def check(type_name, payload, tensors=()):
    return hooks().upstream_payload_check(types()[type_name], payload, list(tensors))


def torch_pickle(*values):
    """A tuple as torch's pickler writes it (protocol 2)."""
    return pickle.dumps(tuple(values), protocol=2)


def torch_pickle_of_raw_string(raw):
    """torch's pickle of a 1-tuple holding `raw` as a string (BINUNICODE, any bytes)."""
    return b"\x80\x02X" + struct.pack("<I", len(raw)) + raw + b"\x85."


def wrapped(inner_type, inner_payload, *metadata):
    """A message wrapped as distributed autograd and the profiler wrap one:
    the inner payload, the wrapper's pickle (the inner type first), its size."""
    tail = torch_pickle(types()[inner_type], *metadata)
    return inner_payload + tail + struct.pack(">q", len(tail))


def python_call(pickled):
    return b"\x00" + pickled  # upstream's async-execution byte, then the pickle


def test_what_upstream_sends_passes():
    udf = pickle.dumps((print, (1, "a"), {}))
    assert check("SCRIPT_CALL", torch_pickle(1.5, "aten::add.Tensor", "aten::add")) == ""
    assert check("PYTHON_CALL", python_call(udf)) == ""
    assert check("PYTHON_RET", udf) == ""
    ascii_udf = pickle.dumps((print, (1, "a"), {}), protocol=0).decode("ascii")
    assert check("PYTHON_REMOTE_CALL", torch_pickle(ascii_udf, (1, 2), (1, 3), False)) == ""
    assert check("EXCEPTION", b"any text \x80\x05") == ""
    assert check("RREF_ACK", b"") == ""
    # the profiler's wrapper around distributed autograd's around a Python call
    autograd = wrapped("PYTHON_CALL", python_call(udf), 7, 8, 0, {})
    assert check("FORWARD_AUTOGRAD_REQ", autograd) == ""
    assert check("RUN_WITH_PROFILING_REQ", wrapped("FORWARD_AUTOGRAD_REQ", autograd, 1, 2, 3)) == ""
    # a type number over 255 is written as a 2-byte int, and a 3-tuple without a MARK
    assert types()["FORWARD_AUTOGRAD_RESP"] > 255
    assert check("RUN_WITH_PROFILING_RESP", wrapped("SCRIPT_RET", torch_pickle(1), 5, 6)) == ""


def test_a_python_pickle_that_would_grow_the_memo_is_refused_wherever_upstream_unpickles_it():
    refused = "pickle memo index 101317043 skips ahead"
    assert refused in check("PYTHON_CALL", python_call(MEMO_BOMB))
    assert refused in check("PYTHON_RET", MEMO_BOMB)
    assert refused in check("PYTHON_REMOTE_CALL", torch_pickle_of_raw_string(MEMO_BOMB))
    assert refused in check("PYTHON_RREF_FETCH_RET", torch_pickle_of_raw_string(MEMO_BOMB))
    inside = check("FORWARD_AUTOGRAD_REQ", wrapped("PYTHON_CALL", python_call(MEMO_BOMB), 7, 8, 0, {}))
    assert inside.startswith("wraps a message that holds Python's") and refused in inside


def test_a_torch_pickle_too_deep_for_torchs_unpickler_is_refused():
    assert "over 1000 levels deep" in check("SCRIPT_CALL", DEEP)
    assert "over 1000 levels deep" in check("SCRIPT_RET", DEEP)
    assert "over 1000 levels deep" in check("RREF_FORK_REQUEST", DEEP)
    assert "over 1000 levels deep" in check("FORWARD_AUTOGRAD_REQ", wrapped("SCRIPT_CALL", DEEP, 7, 8, 0, {}))
    # the wrapper's own pickle too
    tail = DEEP
    assert "has a wrapper whose pickle nests" in check(
        "FORWARD_AUTOGRAD_REQ", torch_pickle(1) + tail + struct.pack(">q", len(tail)))


def test_wrappers_nested_deeper_than_upstream_nests_them_are_refused():
    # upstream's deserializeRequest recurses once per wrapper: 100,000 of
    # them would overflow its stack
    inner = wrapped("SCRIPT_CALL", torch_pickle(1, "f"), 1, 2, 3, {})
    twice = wrapped("FORWARD_AUTOGRAD_REQ", inner, 1, 2, 3)
    assert check("RUN_WITH_PROFILING_REQ", twice) == ""
    thrice = wrapped("RUN_WITH_PROFILING_REQ", twice, 1, 2, 3)
    assert "is wrapped over 2 deep" in check("RUN_WITH_PROFILING_REQ", thrice)


@pytest.mark.parametrize("payload, refused", [
    (b"", "too few for its wrapper's size"),
    (torch_pickle(1) + struct.pack(">q", 0), "declares a wrapper of 0 bytes"),
    (torch_pickle(1) + struct.pack(">q", 1 << 62), "declares a wrapper of 4611686018427387904 bytes in"),
    (torch_pickle(1) + struct.pack(">q", -5), "declares a wrapper of 18446744073709551611 bytes"),
    (b"x" + torch_pickle("not a type", 1) + struct.pack(">q", len(torch_pickle("not a type", 1))),
     "does not begin with the wrapped message's type"),
], ids=["empty", "zero", "huge", "negative", "no-type"])
def test_a_malformed_wrapper_is_refused(payload, refused):
    assert refused in check("FORWARD_AUTOGRAD_RESP", payload)


def test_a_python_pickle_inside_torchs_that_torch_cannot_read_is_refused():
    # torch's pickler names tensors by index into the message's tensor list: index 5 of 1
    ref = (b"\x80\x02ctorch.jit._pickle\nbuild_tensor_from_id\nK\x05\x85R" + b"X" + struct.pack("<I", 3) + b"abc"
           + b"\x86.")
    assert "cannot read" in check("PYTHON_REMOTE_CALL", ref, [torch.ones(1)])


def test_the_fuzzers_upstream_types_are_upstreams():
    from tests.multiprocess import fuzz

    assert fuzz.UPSTREAM_TYPES == {name: t for name, t in types().items() if name != "UNKNOWN"}
