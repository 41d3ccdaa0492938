"""The values calls carry, against a 3-worker job: Python and TorchScript
values, every dtype, views and non-contiguous tensors, empty and 0-dim
tensors, requires_grad, and a tensor over 2 GB."""

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
