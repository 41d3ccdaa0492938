"""torchrpc/exported.py: the signature written into a package's metadata
(names, dtypes, ranks, static sizes, dynamic bounds, returns), the content
hash the cache is keyed by, and the programs it refuses. Exports only; no
AOTInductor compile."""

import pytest
import torch

from tests.csrc import hooks
from torchrpc import exported


class TwoInputs(torch.nn.Module):
    def forward(self, x, y, *, scale):
        return x * scale + y, x.sum()


def export_two_inputs(x=torch.ones(3, 4), unbounded=False):
    batch = torch.export.Dim("batch", min=2) if unbounded else torch.export.Dim("batch", min=2, max=64)
    return torch.export.export(TwoInputs(), (x, torch.ones(3, 4, dtype=torch.float64)), {"scale": torch.tensor(2.0)},
                               dynamic_shapes={"x": {0: batch}, "y": {0: batch}, "scale": None})


def test_signature_names_dtypes_dims_and_returns():
    records = exported.signature(export_two_inputs()).split(";")
    assert records[0] == exported.FORMAT
    kind, name, dtype, layout, dim0, dim1 = records[1].split()
    assert (kind, name, dtype, layout, dim1) == ("arg", "x", "Float", "contiguous", "4")
    symbol, bounds = dim0.split(":")
    assert bounds == "2..64"
    assert records[2].split() == ["arg", "y", "Double", "contiguous", f"{symbol}:2..64", "4"]  # one symbol: equal
    assert records[3] == "kwarg scale Float contiguous -"  # rank 0
    assert records[4] == "returns tuple 2"


def test_unbounded_dynamic_dim():
    assert ":2..inf" in exported.signature(export_two_inputs(unbounded=True))


def test_content_hash_ignores_example_inputs_but_not_weights():
    a = exported.content_hash(export_two_inputs(torch.ones(3, 4)))
    b = exported.content_hash(export_two_inputs(torch.full((3, 4), 7.0)))
    assert a == b

    def linear(seed):
        torch.manual_seed(seed)
        return torch.export.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),))

    assert exported.content_hash(linear(0)) != exported.content_hash(linear(1))


def test_refuses_nested_and_non_tensor_inputs():
    class Nested(torch.nn.Module):
        def forward(self, xs):
            return xs[0] + xs[1]

    with pytest.raises(TypeError, match="input 0 is a list"):
        exported.signature(torch.export.export(Nested(), ([torch.ones(2), torch.ones(2)],)))

    class Dict(torch.nn.Module):
        def forward(self, x):
            return {"out": x + 1}

    with pytest.raises(TypeError, match="return a tensor, or a flat tuple or list"):
        exported.signature(torch.export.export(Dict(), (torch.ones(2),)))


# ---- the callee's side: csrc/script_dispatch/exported_signature.cpp, through test hooks ----

SIG = "torchrpc-exported/1;arg x Float contiguous s0:2..64 4;arg y Double any s0:2..64 *;kwarg scale Float any -;" \
      "returns tuple 2"


def test_callee_schema_from_the_signature():
    assert hooks().exported_schema(SIG, "m") == "m(Tensor x, Tensor y, *, Tensor scale) -> ((Tensor, Tensor))"
    foreign = "torchrpc-exported/1;arg arg0 * any ?;returns list 3"
    assert hooks().exported_schema(foreign, "m") == "m(Tensor arg0) -> Tensor[]"


def test_callee_checks_name_the_argument():
    check = hooks().exported_check
    ok = (torch.ones(5, 4), torch.ones(5, 9, dtype=torch.float64), torch.tensor(1.0))
    check(SIG, list(ok))
    cases = [
        ((torch.ones(5, 4, dtype=torch.int64),) + ok[1:], "argument 'x' must be a Float tensor.*got Long"),
        ((torch.ones(5),) + ok[1:], "argument 'x' must have 2 dimensions.*has 1"),
        ((torch.ones(5, 3),) + ok[1:], "argument 'x' dim 1 must be 4.*is 3"),
        ((torch.ones(1, 4),) + ok[1:], r"argument 'x' dim 0 is 1, outside the bounds .*s0 in 2\.\.64"),
        ((ok[0], torch.ones(6, 9, dtype=torch.float64), ok[2]),
         "argument 'y' dim 0 is 6 but argument 'x' dim 0 is 5; .*equal \\(both s0\\)"),
        (ok[:2] + (torch.ones(1),), "argument 'scale' must have 0 dimensions"),
    ]
    for inputs, says in cases:
        with pytest.raises(TypeError, match=says):
            check(SIG, list(inputs))
    check("torchrpc-exported/1;arg arg0 * any ?;returns tensor", [torch.ones(2, 2, 2, dtype=torch.int8)])  # unchecked


@pytest.mark.parametrize("text, says", [
    ("", "does not start with torchrpc-exported/1"),
    ("torchrpc-exported/2;returns tensor", "does not start with"),
    ("torchrpc-exported/1;arg x Float contiguous 4", "no returns record"),
    ("torchrpc-exported/1;arg x Nope contiguous 4;returns tensor", "unknown dtype 'Nope'"),
    ("torchrpc-exported/1;arg x Float strided 4;returns tensor", "layout 'strided'"),
    ("torchrpc-exported/1;arg x Float any -4;returns tensor", "not a size"),
    ("torchrpc-exported/1;arg x Float any s0:1;returns tensor", "dynamic dim"),
    ("torchrpc-exported/1;arg x Float any 99999999999999999999999;returns tensor", "not a number"),
    ("torchrpc-exported/1;arg x Float;returns tensor", "an input needs"),
    ("torchrpc-exported/1;returns tuple 5000", "too many outputs"),
    ("torchrpc-exported/1;arg x Float any " + " ".join(["1"] * 65) + ";returns tensor", "rank over 64"),
    ("torchrpc-exported/1;" + "arg x Float any 1;" * 1025 + "returns tensor", "too many inputs"),
])
def test_callee_refuses_a_malformed_signature(text, says):
    with pytest.raises(ValueError, match=says):
        hooks().exported_schema(text, "m")
