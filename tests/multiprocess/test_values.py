"""The values calls carry, against a 3-worker job: Python and TorchScript
values, every dtype, views and non-contiguous tensors, empty and 0-dim
tensors, requires_grad, and a tensor over 2 GB."""

import collections
import math

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs
from tests.multiprocess.cluster import Cluster


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3) as c:
        yield c


# ---- values ---------------------------------------------------------------------

NESTED = [
    None, True, 3, -2.5, "text", b"bytes",
    [1, "two", 3.0], (1, (2, (3,))), {"a": [1, 2], "b": {"c": None}},
]


@pytest.mark.parametrize("value", NESTED, ids=repr)
def test_python_values_round_trip(value):
    assert rpc.rpc_sync("worker1", funcs.echo, args=(value,)) == value


# A Python call's plain results come back as IValues, the rest pickled: either
# way with the exact types they had (bool is not int, int keys stay ints).
RESULTS = [
    2 ** 70, True, -0.0, "\ud800", "ü", (), [], {}, [True, False], [True, 1], [1, 2.5], ["a", "b"],
    {1: "a"}, {"a": 1, "b": "x"}, {"a": 1.5}, collections.OrderedDict(a=1), ((1,), [2], {"k": (3,)}),
]


@pytest.mark.parametrize("value", RESULTS, ids=repr)
def test_python_results_keep_their_types(value):
    out = rpc.rpc_sync("worker2", funcs.echo, args=(value,))
    assert out == value and type(out) is type(value)
    if isinstance(value, (list, tuple)):
        assert [type(v) for v in out] == [type(v) for v in value]
    if isinstance(value, dict):
        assert [(type(k), type(v)) for k, v in out.items()] == [(type(k), type(v)) for k, v in value.items()]
    if isinstance(value, float):
        assert math.copysign(1, out) == -1


def test_python_tensor_results_keep_requires_grad_and_sharing():
    t = torch.ones(3, requires_grad=True)
    out = rpc.rpc_sync("worker2", funcs.echo, args=(t,))
    assert out.requires_grad and torch.equal(out, t)
    a, b = rpc.rpc_sync("worker2", funcs.echo, args=((torch.zeros(2), torch.zeros(2)),))
    shared_a, shared_b = rpc.rpc_sync("worker2", funcs.echo, args=((t.detach(),) * 2,))
    a.add_(1)
    shared_a.add_(1)
    assert torch.equal(b, torch.zeros(2)) and torch.equal(shared_b, shared_a)


def test_deeply_nested_python_results():
    assert rpc.rpc_sync("worker2", funcs.nested, args=(200,)) == funcs.nested(200)
    # Arguments around the compact form's depth bound, once echo goes by hash.
    for depth in (60, 62, 64, 70, 70):
        assert rpc.rpc_sync("worker2", funcs.echo, args=(funcs.nested(depth),)) == funcs.nested(depth)
    # Too deep for the pickle: an error that says so, and the worker lives on.
    with pytest.raises(Exception, match="cannot be pickled"):
        rpc.rpc_sync("worker2", funcs.nested, args=(200_000,))
    assert rpc.rpc_sync("worker2", funcs.echo, args=(1,)) == 1


def test_nested_tensors_round_trip():
    value = {"w": [torch.ones(2), (torch.zeros(3, dtype=torch.int64), "x")], "n": 1}
    out = rpc.rpc_sync("worker2", funcs.echo, args=(value,))
    assert out["n"] == 1 and out["w"][1][1] == "x"
    assert torch.equal(out["w"][0], torch.ones(2)) and torch.equal(out["w"][1][0], torch.zeros(3, dtype=torch.int64))


def test_script_values():
    xs = {"k": torch.arange(3)}
    n, f, s, d, was_none = rpc.rpc_sync("worker1", funcs.mixed, args=(4, 1.5, "hi", xs, None))
    assert (n, f, s, was_none) == (5, 3.0, "hi!", True)
    assert torch.equal(d["k"], torch.arange(3))
    assert rpc.rpc_sync("worker1", funcs.no_tensors, args=(21,)) == 42


DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
    torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
]


def _sample(dtype):
    if dtype.is_complex:
        return torch.randn(3, 4, dtype=dtype)
    if dtype == torch.bool:
        return torch.tensor([[True, False, True, False]] * 3)
    return torch.arange(12).view(3, 4).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype(dtype):
    x = _sample(dtype)
    for fn in (funcs.echo, funcs.echo_list):
        out = rpc.rpc_sync("worker1", fn, args=([x],))
        assert out[0].dtype == dtype and out[0].shape == x.shape
        assert torch.equal(out[0].view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("make", [
    lambda: torch.arange(12.0).view(3, 4).t(),          # transposed
    lambda: torch.arange(20.0)[::3],                     # strided
    lambda: torch.arange(24.0).view(2, 3, 4)[:, 1:, ::2],  # both
    lambda: torch.arange(5.0).expand(3, 5),              # stride 0
], ids=["transposed", "strided", "sliced", "expanded"])
def test_non_contiguous(make):
    x = make()
    assert torch.equal(rpc.rpc_sync("worker1", funcs.echo, args=(x,)), x)
    assert torch.equal(rpc.rpc_sync("worker1", funcs.add, args=(x, x)), x + x)
    assert torch.equal(rpc.rpc_sync("worker1", torch.clone, args=(x,)), x)


def test_view_sends_only_its_elements():
    big = torch.arange(1_000_000, dtype=torch.float32)
    view = big[10:20]
    assert rpc.rpc_sync("worker1", funcs.storage_nbytes, args=(view,)) == 10 * 4
    out = rpc.rpc_sync("worker1", funcs.echo, args=(view,))
    assert torch.equal(out, view) and out.untyped_storage().nbytes() == 40


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4, 0)])
def test_empty_tensors(shape):
    x = torch.empty(shape)
    for fn in (funcs.echo, torch.clone):
        out = rpc.rpc_sync("worker2", fn, args=(x,))
        assert out.shape == x.shape and out.dtype == x.dtype


def test_zero_dim_and_requires_grad_flag():
    out = rpc.rpc_sync("worker1", funcs.echo, args=(torch.tensor(3.5),))
    assert out.dim() == 0 and out.item() == 3.5
    p = torch.nn.Parameter(torch.ones(2))
    back = rpc.rpc_sync("worker1", funcs.echo, args=(p,))
    assert isinstance(back, torch.nn.Parameter) and back.requires_grad


def _available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.timeout(300)
def test_tensor_over_2gb():
    nbytes = 2**31 + 4096
    if _available_bytes() < 4 * nbytes:
        pytest.skip(f"needs {4 * nbytes >> 30} GiB of free memory for sender and receiver copies")
    # float64: summing 2 GB of uint8 takes ~18 s here, of float64 well under 1 s
    x = torch.ones(nbytes // 8, dtype=torch.float64)
    x[-1] = 5
    assert rpc.rpc_sync("worker1", funcs.checksum, args=(x,), timeout=240) == nbytes // 8 + 4
    del x
