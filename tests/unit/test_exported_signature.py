"""torchrpc/exported.py: the signature written into a package's metadata
(names, dtypes, ranks, static sizes, dynamic bounds, returns), the content
hash the cache is keyed by, and the programs it refuses. Exports only; no
AOTInductor compile."""

import pytest
import torch

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
