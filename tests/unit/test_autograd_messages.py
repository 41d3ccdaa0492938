"""Distributed autograd's binary messages (csrc/autograd/autograd_messages),
through test hooks: what a backward hop sends survives the trip, and a
malformed payload is refused with an error that says what is wrong."""

import struct

import pytest
import torch

from tests.csrc import hooks

# contextId, sendId, retain_graph, count, root rank, backward id, pass id
HEADER = struct.Struct("<qqBIiqq")
NO_REPORT = b"\x00"


def test_gradients_and_gaps_survive_the_trip():
    a, b = torch.randn(3, 4), torch.arange(6.0).view(2, 3).t()  # b is not contiguous
    payload, tensors = hooks().encode_backward(1 << 48 | 5, 7, True, [a, None, b], root=2,
                                          backward_id=9, pass_id=1 << 40 | 3)
    assert len(tensors) == 2  # only the present gradients travel as tensors
    context_id, send_id, retain, grads, root, backward_id, pass_id, report = hooks().parse_backward(
        payload, tensors)
    assert (context_id, send_id, retain) == (1 << 48 | 5, 7, True)
    assert (root, backward_id, pass_id, report) == (2, 9, 1 << 40 | 3, None)
    assert grads[1] is None and torch.equal(grads[0], a) and torch.equal(grads[2], b)


def test_no_gradients_at_all():
    payload, tensors = hooks().encode_backward(3, 0, False, [None, None])
    assert tensors == [] and hooks().parse_backward(payload, tensors) == (3, 0, False, [None, None],
                                                                     0, 0, 0, None)


def test_a_pass_report_rides_along():
    """A pass that sends to the worker that called backward() reports there,
    inside that message: its id and the passes its messages start."""
    payload, tensors = hooks().encode_backward(3, 1, False, [torch.ones(2)], report=(5, [6, 1 << 41]))
    assert hooks().parse_backward(payload, tensors)[-1] == (5, [6, 1 << 41])
    payload, _ = hooks().encode_backward(3, 1, False, [None], report=(5, []))
    assert hooks().parse_backward(payload, [])[-1] == (5, [])


def test_pass_done_survives_the_trip():
    assert hooks().parse_pass_done(hooks().encode_pass_done(4, 7, [8, 9])) == (4, 7, [8, 9])
    assert hooks().parse_pass_done(hooks().encode_pass_done(4, 7, [])) == (4, 7, [])


def _head(retain=0, count=1):
    return HEADER.pack(1, 2, retain, count, 0, 3, 4)


@pytest.mark.parametrize("payload, tensors, error", [
    (b"", [], "0 bytes"),
    (_head(), [], "41 bytes for 1 gradients"),  # the flags are missing
    (_head() + b"\x01", [torch.ones(1)], "42 bytes for 1 gradients"),  # no report flag
    (_head() + b"\x01" + NO_REPORT + b"x", [torch.ones(1)], "1 bytes after the gradient flags"),
    (_head(retain=2, count=0) + NO_REPORT, [], "retain_graph flag 2"),
    (_head() + b"\x07" + NO_REPORT, [torch.ones(1)], "gradient flag 7"),
    (_head(count=2) + b"\x01\x01" + NO_REPORT, [torch.ones(1)], "1 tensors for more present gradients"),
    (_head() + b"\x00" + NO_REPORT, [torch.ones(1)], "1 tensors for 0 present gradients"),
    (_head(count=0xFFFFFFFF), [], "41 bytes for 4294967295 gradients"),
    (_head(count=0) + b"\x02", [], "report flag 2"),
    (_head(count=0) + b"\x01" + struct.pack("<q", 5), [], "8 bytes for a pass report"),
    (_head(count=0) + b"\x01" + struct.pack("<qIq", 5, 2, 6), [], "8 bytes for 2 child passes"),
])
def test_malformed_backward_payloads_are_refused(payload, tensors, error):
    with pytest.raises(RuntimeError, match="malformed AUTOGRAD_BACKWARD: " + error):
        hooks().parse_backward(payload, tensors)


@pytest.mark.parametrize("payload, error", [
    (b"", "0 bytes"),
    (struct.pack("<qq", 1, 2), "8 bytes for a pass report"),
    (struct.pack("<qqIq", 1, 2, 0, 9), "8 bytes for 0 child passes"),
    (struct.pack("<qqI", 1, 2, 0xFFFFFFFF), "0 bytes for 4294967295 child passes"),
])
def test_malformed_pass_reports_are_refused(payload, error):
    with pytest.raises(RuntimeError, match="malformed AUTOGRAD_PASS_DONE: " + error):
        hooks().parse_pass_done(payload)
