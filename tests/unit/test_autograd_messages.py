"""Distributed autograd's binary messages (csrc/autograd/autograd_messages),
through test hooks: what a backward hop sends survives the trip, and a
malformed payload is refused with an error that says what is wrong."""

import struct

import pytest
import torch

from torchrpc._extension import native

C = native()
HEADER = struct.Struct("<qqBI")  # contextId, sendId, retain_graph, count


def test_gradients_and_gaps_survive_the_trip():
    a, b = torch.randn(3, 4), torch.arange(6.0).view(2, 3).t()  # b is not contiguous
    payload, tensors = C._encode_backward(1 << 48 | 5, 7, True, [a, None, b])
    assert len(tensors) == 2  # only the present gradients travel as tensors
    context_id, send_id, retain, grads = C._parse_backward(payload, tensors)
    assert (context_id, send_id, retain) == (1 << 48 | 5, 7, True)
    assert grads[1] is None and torch.equal(grads[0], a) and torch.equal(grads[2], b)


def test_no_gradients_at_all():
    payload, tensors = C._encode_backward(3, 0, False, [None, None])
    assert tensors == [] and C._parse_backward(payload, tensors) == (3, 0, False, [None, None])


@pytest.mark.parametrize("payload, tensors, error", [
    (b"", [], "0 bytes"),
    (HEADER.pack(1, 2, 0, 1), [], "21 bytes for 1 gradients"),  # the flags are missing
    (HEADER.pack(1, 2, 0, 1) + b"\x01" + b"x", [torch.ones(1)], "23 bytes for 1 gradients"),
    (HEADER.pack(1, 2, 2, 0), [], "retain_graph flag 2"),
    (HEADER.pack(1, 2, 0, 1) + b"\x07", [torch.ones(1)], "gradient flag 7"),
    (HEADER.pack(1, 2, 0, 2) + b"\x01\x01", [torch.ones(1)], "1 tensors for more present gradients"),
    (HEADER.pack(1, 2, 0, 1) + b"\x00", [torch.ones(1)], "1 tensors for 0 present gradients"),
    (HEADER.pack(1, 2, 0, 0xFFFFFFFF), [], "21 bytes for 4294967295 gradients"),
])
def test_malformed_backward_payloads_are_refused(payload, tensors, error):
    with pytest.raises(RuntimeError, match="malformed AUTOGRAD_BACKWARD: " + error):
        C._parse_backward(payload, tensors)
