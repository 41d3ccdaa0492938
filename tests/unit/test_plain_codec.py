"""The compact form of plain IValue payloads (csrc/message/plain_codec.*):
what it carries decodes to what the pickle would, the same types included;
everything else still travels as a pickle; a peer's malformed bytes get an
error, never a crash or an allocation they declare."""

import struct

import pytest
import torch

from tests.csrc import hooks

PLAIN, PICKLE = b"\x00P", b"\x80"


def roundtrip(value, type=""):
    payload, tensors = hooks().encode_payload(value, type)
    decoded, type_str = hooks().decode_payload(payload, tensors)
    return payload, decoded, type_str


@pytest.mark.parametrize("value", [
    None, True, False, 0, -1, 2 ** 62, -(2 ** 63), 1.5, float("inf"), -0.0, "", "text", "ü" * 300,
    torch.ones(2), (), (1, "a", None), [1, 2, 3], [1.0, 2.5], [True, False], ["a", "b"],
    [torch.ones(1), torch.zeros(2)], {"a": 1, "b": 2}, {"a": torch.ones(1)}, {1: "x", 2: "y"},
    (torch.ones(2), 3, "x"),
], ids=repr)
def test_plain_values_travel_compactly_and_keep_their_types(value):
    payload, decoded, type_str = roundtrip(value)
    assert payload.startswith(PLAIN)
    assert type_str == hooks().inferred_type(value)
    if isinstance(value, torch.Tensor):
        assert torch.equal(decoded, value)
    elif isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
        assert torch.equal(decoded[0], value[0]) and decoded[1:] == value[1:]
    elif isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
        assert all(torch.equal(a, b) for a, b in zip(decoded, value))
    elif isinstance(value, dict) and any(isinstance(v, torch.Tensor) for v in value.values()):
        assert torch.equal(decoded["a"], value["a"])
    else:
        assert decoded == value and type(decoded) is type(value)


@pytest.mark.parametrize("value, type", [
    ([], "List[int]"), ([], "List[Tensor]"), ({}, "Dict[str, Any]"), ({}, "Dict[int, Tensor]"),
    ({"a": 1, "b": "x", "c": None}, "Dict[str, Any]"), (("f", "", (1,), {}, None, False),
                                                       "Tuple[str, str, Tuple[int], Dict[str, Any], NoneType, bool]"),
])
def test_typed_empty_containers_and_dicts_of_any_keep_their_types(value, type):
    payload, decoded, type_str = roundtrip(value, type)
    assert payload.startswith(PLAIN)
    assert decoded == value and type_str == type


@pytest.mark.parametrize("value", [
    [[1, 2], [3]], {"a": [1, 2]}, complex(1, 2), torch.device("cpu"), {True: 1}, {1.5: "x"},
], ids=repr)
def test_other_values_are_still_pickled(value):
    payload, decoded, type_str = roundtrip(value)
    assert payload.startswith(PICKLE)
    assert decoded == value
    assert type_str == hooks().inferred_type(value)


def test_a_tensor_sent_twice_stays_one_tensor():
    t = torch.zeros(2)
    payload, (a, b), _ = roundtrip((t, t))
    assert payload.startswith(PICKLE)  # the pickle keeps the aliasing
    a.add_(1)
    assert torch.equal(b, torch.ones(2))
    payload, (a, b), _ = roundtrip((t, torch.zeros(2)))
    assert payload.startswith(PLAIN)
    a.add_(1)
    assert torch.equal(b, torch.zeros(2))


def test_many_containers_held_once_travel_compactly():
    # Only containers held elsewhere too are tracked for aliasing (up to 256).
    value = tuple({"k": i} for i in range(300)) + tuple([i] for i in range(300))
    payload, decoded, _ = roundtrip(value)
    assert payload.startswith(PLAIN)
    assert decoded == value


def test_deep_nesting_is_pickled_and_refused_from_a_peer():
    value = 1
    for _ in range(70):
        value = (value,)
    payload, decoded, _ = roundtrip(value)
    assert payload.startswith(PICKLE) and decoded == value
    hostile = PLAIN + b"\x07\x01\x00\x00\x00" * 100 + b"\x00"  # tuples of one, 100 deep
    with pytest.raises(RuntimeError, match="nested deeper than 64"):
        hooks().decode_payload(hostile, [])


def u32(n):
    return struct.pack("<I", n)


@pytest.mark.parametrize("payload, tensors, why", [
    (PLAIN, [], "declares 1 bytes, 0 left"),
    (PLAIN + b"\x05" + u32(0xFFFFFFF0) + b"ab", [], "declares 4294967280 bytes, 2 left"),
    (PLAIN + b"\x08\x01" + u32(0xFFFFFFFF), [], "declares 4294967295 elements, 0 bytes left"),
    (PLAIN + b"\x09\x04\x00" + u32(1 << 30) + b"\x00" * 8, [], "declares 1073741824 elements, 8 bytes left"),
    (PLAIN + b"\x06" + u32(1), [torch.ones(1)], "tensor 1 of 1"),
    (PLAIN + b"\x63", [], "unknown tag 99"),
    (PLAIN + b"\x08\x09" + u32(0), [], "unknown kind 9"),
    (PLAIN + b"\x09\x03\x00" + u32(0), [], "a dict keyed by kind 3"),
    (PLAIN + b"\x08\x01" + u32(1) + b"\x05" + u32(1) + b"x", [], "a int container holds a String"),
    (PLAIN + b"\x09\x04\x00" + u32(1) + b"\x03" + b"\x00" * 8 + b"\x00", [], "a str container holds a Int"),
    (PLAIN + b"\x00\x00", [], "1 bytes after the value"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_malformed_payloads_are_refused_with_what_is_wrong(payload, tensors, why):
    with pytest.raises(RuntimeError, match="malformed SCRIPT_RET payload: .*" + why):
        hooks().decode_payload(payload, tensors)


def test_every_truncation_of_a_call_is_refused():
    payload, tensors = hooks().encode_payload(("f", "m", (torch.ones(2), 3, [1.5], {"k": "v"}), {}, None, True),
                                              "Tuple[str, str, Tuple[Tensor, int, List[float], Dict[str, str]], "
                                              "Dict[str, Any], NoneType, bool]")
    assert payload.startswith(PLAIN)
    for end in range(len(PLAIN), len(payload)):
        with pytest.raises(RuntimeError, match="malformed"):
            hooks().decode_payload(payload[:end], tensors)
