"""A C++ program in a job with Python workers: it links libtorchrpc (no
Python), loads a TorchScript model saved here, whose forward calls Python
workers, and serves that model to them (tutorials/cpp_worker). It also
serves an exported program (an AOTInductor package compiled by torchrpc,
the program of test_exported_program.py, from the session's cache), its
signature read from the package's metadata in C++."""

import time

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs, rref_funcs
from tests.multiprocess import test_exported_program as programs
from torchrpc import exported
from tests.multiprocess.cluster import Cluster

X = torch.arange(3.0)


@pytest.fixture(scope="module")
def job(tmp_path_factory, aoti_cache):
    from tutorials.cpp_worker import build

    binary = build.build()
    model = str(tmp_path_factory.mktemp("model") / "shards.pt")
    torch.jit.script(funcs.Shards(["worker0", "worker1"])).save(model)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(exported.CACHE_ENV, aoti_cache)
        package = exported.package(programs.export_model())
    cpp = {2: lambda port: [binary, "worker2", "2", "3", "127.0.0.1", str(port), model, "--try",
                            "--package", "ep.model", package]}
    with Cluster(3, programs=cpp) as c:
        yield c


def test_cpp_worker_ran_the_model_calling_python_workers(job):
    deadline = time.monotonic() + 30
    while "forward(" not in job.log(2) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "worker2: joined a job of 3 workers" in job.log(2)
    assert "worker2: forward([0, 1, 2]) = [0, 6, 12]" in job.log(2), job.log(2)


def test_python_calls_the_cpp_worker(job):
    # worker2 runs the model in C++; its forward calls worker0 and worker1 back
    assert torch.equal(rpc.rpc_sync("worker2", "worker2.forward", args=(X,)), X * 6)
    assert torch.equal(rpc.rpc_async("worker2", "worker2.forward", args=(X,)).wait(), X * 6)
    assert torch.equal(rpc.rpc_sync("worker1", funcs.call, args=("worker2", "worker2.forward", (X,))), X * 6)


def test_cpp_worker_reports_schema_mismatch(job):
    with pytest.raises(TypeError, match="worker2.forward.*worker2"):
        rpc.rpc_sync("worker2", "worker2.forward", args=("text",))


def test_cpp_worker_owns_and_serves_rrefs(job):
    # remote() on the C++ worker: its RRef context creates the value with the
    # loaded model's forward (which itself calls worker0 and worker1)
    rref = rpc.remote("worker2", "worker2.forward", args=(X,))
    assert rref.owner_name() == "worker2"
    assert torch.equal(rref.to_here(), X * 6)
    # a third worker fetches it from the C++ owner, from TorchScript
    assert torch.equal(rpc.rpc_sync("worker1", rref_funcs.script_to_here, args=(rref,)), X * 6)
    # proxies need Python on the owner: a clear error, not a hang
    with pytest.raises(RuntimeError, match=r"(?s)add\(\) of RRef.*worker2 runs no Python"):
        rref.rpc_sync(timeout=10).add(X)
    del rref
    rref_funcs.rref_settle()
    assert rpc.rpc_sync("worker1", rref_funcs.rref_settle) == 0
    assert rpc.rref._live_rrefs()["users"] == []


def test_python_calls_an_exported_program_on_the_cpp_worker(job):
    assert "worker2: serving the exported program" in job.log(2)
    x, y, scale = torch.randn(5, 4), torch.randn(3), torch.tensor(0.5)
    ref = programs.export_model().module()(x, y, scale=scale)
    out = rpc.rpc_sync("worker2", "ep.model", args=(x, y), kwargs={"scale": scale})
    assert isinstance(out, tuple) and len(out) == 2
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b)
    # the signature from the package's metadata checks inputs in C++
    with pytest.raises(TypeError, match=r"'ep.model'.*worker2.*argument 'x'"):
        rpc.rpc_sync("worker2", "ep.model", args=(x.double(), y), kwargs={"scale": scale})
