"""Exported programs (torch.export, compiled by AOTInductor) as callees: by
registered name from eager code and from TorchScript, inputs checked against
the exported signature before anything runs, inference-only inside
distributed autograd, concurrent calls, and no GIL on the callee.

One small program is compiled once (about 30 s here) into the session's
package cache (tests/conftest.py: test_cpp_worker.py serves it too); worker1 and worker2 register the package
by its path, this process registers the ExportedProgram itself (a cache hit).
"""

import json
import threading
import time
import zipfile
from typing import Tuple

import pytest
import torch
from torch.testing import assert_close

import torchrpc as rpc
from torchrpc import exported, shipped_code
from tests.multiprocess import funcs
from tests.multiprocess.cluster import Cluster


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(12.0).reshape(4, 3) / 10)

    def forward(self, x, y, *, scale):
        return (x @ self.w) * scale + y.sum(), torch.relu(x)


def export_model():
    batch = torch.export.Dim("batch", min=2, max=64)
    return torch.export.export(Model(), (torch.ones(2, 4), torch.ones(3)), {"scale": torch.tensor(2.0)},
                               dynamic_shapes={"x": {0: batch}, "y": None, "scale": None})


EP = None
X, Y, SCALE = torch.randn(5, 4), torch.randn(3), torch.tensor(0.5)


@pytest.fixture(scope="module", autouse=True)
def job(tmp_path_factory, monkeypatch_module, aoti_cache):
    global EP
    monkeypatch_module.setenv(exported.CACHE_ENV, aoti_cache)
    EP = export_model()
    started = time.time()
    path = exported.package(EP)
    print(f"AOTInductor compile: {time.time() - started:.1f} s")
    # worker2 takes no shipped code: it serves the package it registered, by name
    foreign = without_signature(path, tmp_path_factory.mktemp("foreign") / "foreign.pt2")
    with Cluster(3, worker_options={2: {"allow_shipped_code": False}}) as c:
        for worker in ("worker1", "worker2"):
            rpc.rpc_sync(worker, rpc.register, args=("ep.model", path))
        rpc.rpc_sync("worker1", rpc.register, args=("ep.foreign", str(foreign)))
        rpc.register("ep.model", EP)  # this process: the program itself, compiled already
        yield c


def with_metadata(path, out, change):
    """A copy of the package at `path` whose metadata `change` edited."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("_metadata.json"):
                meta = json.loads(data)
                change(meta)
                data = json.dumps(meta).encode()
            dst.writestr(item, data)
    return out


def without_signature(path, out):
    """As if compiled by torch alone."""
    return with_metadata(path, out, lambda meta: meta.pop(exported.SIGNATURE_KEY, None))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def expected(x=X, y=Y, scale=SCALE):
    return EP.module()(x, y, scale=scale)


def assert_same(out, ref):
    assert isinstance(out, tuple) and len(out) == 2
    for a, b in zip(out, ref):
        assert_close(a, b)


# ---- calls by name -----------------------------------------------------------------

@pytest.mark.parametrize("to", ["worker1", "worker0"])
def test_by_name_returns_what_the_program_returns_locally(to):
    assert_same(rpc.rpc_sync(to, "ep.model", args=(X, Y), kwargs={"scale": SCALE}), expected())
    fut = rpc.rpc_async(to, "ep.model", args=(X, Y), kwargs={"scale": SCALE})
    assert_same(fut.wait(), expected())
    rref = rpc.remote(to, "ep.model", args=(X, Y), kwargs={"scale": SCALE})
    assert_same(rref.to_here(), expected())


def test_dynamic_batch_within_bounds():
    for batch in (2, 17, 64):
        x = torch.randn(batch, 4)
        assert_same(rpc.rpc_sync("worker2", "ep.model", args=(x, Y), kwargs={"scale": SCALE}), expected(x))


def test_strided_input_is_made_contiguous():
    x = torch.randn(4, 10)[:, ::2].t()[:, :4]
    assert not x.is_contiguous()
    assert_same(rpc.rpc_sync("worker1", "ep.model", args=(x, Y), kwargs={"scale": SCALE}), expected(x))


@torch.jit.script
def script_caller(to: str, x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    out = rpc.rpc_async(to, "ep.model", args=(x, y), kwargs={"scale": scale}).wait()
    assert isinstance(out, Tuple[torch.Tensor, torch.Tensor])
    return out


def test_torchscript_caller_by_name():
    assert_same(script_caller("worker1", X, Y, SCALE), expected())
    assert_same(script_caller("worker0", X, Y, SCALE), expected())


def test_package_compiled_elsewhere_is_called_by_its_call_spec():
    # no torchrpc signature: inputs named by position, the kwarg by its key, no dtype or shape checks
    assert_same(rpc.rpc_sync("worker1", "ep.foreign", args=(X, Y), kwargs={"scale": SCALE}), expected())
    with pytest.raises(TypeError, match="'ep.foreign'.*argument 'arg1'"):
        rpc.rpc_sync("worker1", "ep.foreign", args=(X,), kwargs={"scale": SCALE})


# ---- inputs checked before anything runs --------------------------------------------

@pytest.mark.parametrize("args, kwargs, says", [
    ((X,), {"scale": SCALE}, "argument 'y'"),
    ((X, Y, Y), {"scale": SCALE}, "argument"),
    ((X, Y), {}, "argument 'scale'"),
    ((X.double(), Y), {"scale": SCALE}, "argument 'x' must be a Float tensor"),
    ((X.long(), Y), {"scale": SCALE}, "but got Long"),
    ((X[0], Y), {"scale": SCALE}, "argument 'x' must have 2 dimensions"),
    ((X, Y), {"scale": SCALE.reshape(1)}, "argument 'scale' must have 0 dimensions"),
    ((torch.randn(5, 3), Y), {"scale": SCALE}, "argument 'x' dim 1 must be 4"),
    ((torch.randn(65, 4), Y), {"scale": SCALE}, "argument 'x' dim 0 is 65, outside the bounds"),
    ((X, "text"), {"scale": SCALE}, "argument 'y'"),
])
def test_mismatched_inputs_raise_type_error_naming_the_argument(args, kwargs, says):
    with pytest.raises(TypeError) as info:
        rpc.rpc_sync("worker1", "ep.model", args=args, kwargs=kwargs)
    text = str(info.value)
    assert says in text and "'ep.model'" in text and "worker1" in text, text


def test_mismatch_from_torchscript_is_a_type_error_too():
    with pytest.raises(Exception, match="argument 'x' must be a Float tensor"):
        script_caller("worker2", X.double(), Y, SCALE)


# ---- inference only --------------------------------------------------------------

def test_requires_grad_inside_dist_autograd_context_is_refused():
    x = X.clone().requires_grad_()
    with rpc.autograd.context():
        with pytest.raises(RuntimeError, match="inference-only.*argument 'x' requires grad"):
            rpc.rpc_sync("worker1", "ep.model", args=(x, Y), kwargs={"scale": SCALE})
        # detached inputs are fine inside a context
        assert_same(rpc.rpc_sync("worker1", "ep.model", args=(x.detach(), Y), kwargs={"scale": SCALE}), expected())
    # outside a context, an input that requires grad is just an input
    assert_same(rpc.rpc_sync("worker1", "ep.model", args=(x, Y), kwargs={"scale": SCALE}), expected())


# ---- concurrency and the GIL -------------------------------------------------------

def test_concurrent_calls_are_all_correct():
    inputs = [torch.randn(2 + i % 60, 4) for i in range(64)]
    futs = [rpc.rpc_async("worker2", "ep.model", args=(x, Y), kwargs={"scale": SCALE}) for x in inputs]
    for x, fut in zip(inputs, futs):
        assert_same(fut.wait(), expected(x))
    errors = []

    def caller(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            for _ in range(20):
                x = torch.randn(8, 4, generator=g)
                assert_same(rpc.rpc_sync("worker1", "ep.model", args=(x, Y), kwargs={"scale": SCALE}), expected(x))
        except Exception as err:  # noqa: BLE001  reported below
            errors.append(err)

    threads = [threading.Thread(target=caller, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_exported_calls_run_while_the_callee_holds_the_gil():
    rpc.rpc_sync("worker2", "ep.model", args=(X, Y), kwargs={"scale": SCALE})
    with funcs.gil_held_on("worker2", "exported calls", seconds=2.0):
        for _ in range(10):
            rpc.rpc_sync("worker2", "ep.model", args=(X, Y), kwargs={"scale": SCALE}, timeout=10)


# ---- the program itself, shipped ------------------------------------------------------

def test_program_called_directly_ships_its_package_once_per_callee():
    # remote() first: it has no resend path, so it carries the package
    assert_same(rpc.remote("worker1", EP, args=(X, Y), kwargs={"scale": SCALE}).to_here(), expected())
    assert shipped_code.shipped(EP, 1)
    for _ in range(3):  # by hash alone from now on
        assert_same(rpc.rpc_sync("worker1", EP, args=(X, Y), kwargs={"scale": SCALE}), expected())
    assert_same(rpc.rpc_async("worker1", EP, args=(X, Y), kwargs={"scale": SCALE}).wait(), expected())
    # rpc_sync to a callee without it: the hash alone, refused, resent with the package
    assert_same(rpc.rpc_sync("worker0", EP, args=(X, Y), kwargs={"scale": SCALE}), expected())
    names = rpc.rpc_sync("worker1", rpc.api._debug_info)["script_functions"]
    assert sum(n.startswith("sha1:") for n in names) == 1, names


def test_program_called_directly_checks_inputs():
    with pytest.raises(TypeError, match="argument 'x' must be a Float tensor") as info:
        rpc.rpc_sync("worker1", EP, args=(X.double(), Y), kwargs={"scale": SCALE})
    assert "'exported:" in str(info.value) and "worker1" in str(info.value)


def test_callee_that_takes_no_shipped_code_refuses_the_package():
    with pytest.raises(rpc.CalleePolicyError, match="worker2"):
        rpc.rpc_sync("worker2", EP, args=(X, Y), kwargs={"scale": SCALE})


# ---- registration ------------------------------------------------------------------

def test_register_refuses_what_it_cannot_serve(tmp_path):
    with pytest.raises(TypeError, match="ExportedProgram"):
        rpc.register("ep.bad", 42)
    with pytest.raises(FileNotFoundError, match="no AOTInductor package"):
        rpc.register("ep.missing", str(tmp_path / "missing.pt2"))
    (tmp_path / "text.pt2").write_text("not a zip")
    with pytest.raises(ValueError, match="is not an AOTInductor package"):
        rpc.register("ep.text", str(tmp_path / "text.pt2"))
    assert not {"ep.missing", "ep.text"} & set(rpc.api._debug_info()["script_functions"])


# ISA names in a package's AOTI_CPU_ISA -> the CPU features it needs (as exported_program.cpp)
ISA_FEATURES = {"AVX2": ["avx2", "fma3"], "AVX512": ["avx512_f", "avx512_dq", "avx512_vl", "avx512_bw"],
                "AVX512_VNNI": ["avx512_vnni"], "AMX_TILE": ["amx_tile"]}


def test_package_for_a_cpu_isa_this_cpu_lacks_is_refused_before_it_loads(tmp_path):
    have = torch._C._cpu._get_cpu_capability()
    lacking = [isa for isa, features in ISA_FEATURES.items() if not all(have.get(f, True) for f in features)]
    if not lacking:
        pytest.skip("this CPU has every vector ISA AOTInductor compiles for")
    path = with_metadata(exported.package(EP), tmp_path / "isa.pt2", lambda meta: meta.update(AOTI_CPU_ISA=lacking[0]))
    with pytest.raises(ValueError, match=f"compiled for CPU ISA '{lacking[0]}', but this CPU lacks"):
        rpc.register("ep.isa", str(path))
