"""RPC from inside TorchScript (the torchrpc::rpc_async / rpc_sync ops),
calls by name, @async_execution, and TorchScript deployment (save, load in
another process). Every worker has ONE pool thread: nested calls must not
deadlock, because waiting suspends the interpreter and frees the thread."""

import io
import os
import subprocess
import sys
import zipfile

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs
from tests.multiprocess.cluster import ROOT, Cluster


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3, threads=1) as c:
        yield c


X = torch.arange(3.0)


# ---- calls by name, eager ----------------------------------------------------------

@pytest.mark.parametrize("kind", ["rpc_sync", "rpc_async"])
def test_eager_call_by_registered_name(kind):
    out = getattr(rpc, kind)("worker1", "tests.add", args=(X, X))
    assert torch.equal(out if kind == "rpc_sync" else out.wait(), X + X)


def test_call_by_name_fills_defaults_and_kwargs():
    assert torch.equal(rpc.rpc_sync("worker1", "tests.add_with_default", args=(X, X)), X + X)
    assert torch.equal(rpc.rpc_sync("worker1", "tests.add_with_default", args=(X,), kwargs={"b": X, "scale": 3.0}),
                       (X + X) * 3)


def test_a_function_registered_under_two_names_is_served_under_both():
    for name in ("tests.times_four", "tests.quadruple"):
        assert torch.equal(rpc.rpc_sync("worker1", name, args=(X,)), X * 4)
    assert torch.equal(rpc.rpc_sync("worker1", funcs.times_four, args=(X,)), X * 4)


def test_call_by_qualified_name():
    assert torch.equal(rpc.rpc_sync("worker2", funcs.triple.qualified_name, args=(X,)), X * 3)


def test_schema_mismatch_names_callee_argument_and_types():
    with pytest.raises(TypeError) as info:
        rpc.rpc_sync("worker1", "tests.add", args=(X, "text"))
    text = str(info.value)
    assert "'tests.add'" in text and "argument 'b'" in text and "Tensor" in text and "str" in text
    assert "worker1" in text
    with pytest.raises(TypeError, match="argument 'b'"):
        rpc.rpc_sync("worker1", "tests.add", args=(X,))


def test_unknown_name_says_how_to_fix():
    with pytest.raises(RuntimeError, match="no TorchScript function named 'tests.nope'.*torchrpc.register"):
        rpc.rpc_sync("worker1", "tests.nope", args=(X,))


# ---- the ops, from scripted code ---------------------------------------------------

def test_scripted_rpc_async_and_rpc_sync_run_here():
    assert torch.equal(funcs.script_calls_async("worker1", X), X + X)
    assert torch.equal(funcs.script_calls_sync("worker2", X, 2.0), (X + X) * 2)
    assert torch.equal(funcs.script_calls_async("worker0", X), X + X)  # to oneself


def test_scripted_fan_out_and_torch_jit_wait():
    assert torch.equal(funcs.script_fans_out(["worker1", "worker2", "worker0"], X), X * 9)


def test_scripted_caller_running_as_a_remote_callee():
    assert torch.equal(rpc.rpc_sync("worker1", funcs.script_calls_async, args=("worker2", X)), X + X)
    assert torch.equal(rpc.rpc_sync("worker2", "tests.script_calls_async", args=("worker1", X)), X + X)


def test_nested_calls_on_one_thread_per_worker_do_not_deadlock():
    # worker1 (1 thread) -> worker2 (1 thread) -> worker1 again, all waiting
    out = rpc.rpc_sync("worker1", funcs.script_nested, args=("worker1", "worker2", X), timeout=20)
    assert torch.equal(out, X + X + 1)
    futs = [rpc.rpc_async("worker1", funcs.script_nested, args=("worker1", "worker2", X), timeout=20)
            for _ in range(8)]
    assert all(torch.equal(f.wait(), X + X + 1) for f in futs)


def test_a_forked_nested_call_on_one_thread_per_worker_does_not_deadlock():
    # worker1 forks a task that calls worker2, which calls worker1 back, and waits for the task
    out = rpc.rpc_sync("worker1", funcs.script_forks_nested, args=("worker1", "worker2", X), timeout=20)
    assert torch.equal(out, X + X + 1)


def test_errors_inside_scripted_callers():
    with pytest.raises(Exception, match="(?s)TypeError: calling 'tests.add'.*argument 'b'.*worker1"):
        torch.jit.script(_bad_call)("worker1", X)
    with pytest.raises(Exception, match="no worker of this job is named 'nobody'"):
        funcs.script_calls_async("nobody", X)


def _bad_call(to: str, x: torch.Tensor) -> torch.Tensor:
    out = rpc.rpc_sync(to, "tests.add", args=(x, "oops"))
    assert isinstance(out, torch.Tensor)
    return out


def test_arguments_that_miss_the_schema_are_a_type_and_runtime_error():
    for cls in (TypeError, RuntimeError):  # ours, and upstream's class
        with pytest.raises(cls, match=r"add\(\) expected at most 2 argument"):
            rpc.rpc_sync("worker1", funcs.add, args=(X, X, X))
        with pytest.raises(cls, match="expected at most 2"):
            rpc.remote("worker1", funcs.add, args=(X, X, X))


def test_distributed_autograd_from_torchscript():
    assert "dist_backward" in str(funcs.script_backward_and_gradients.graph)  # as upstream checks
    x = torch.ones(3, requires_grad=True)
    with rpc.autograd.context() as ctx:
        loss = rpc.rpc_sync("worker1", torch.mul, args=(x, 3.0)).sum()
        grads = funcs.script_backward_and_gradients(ctx, loss)
    assert list(grads) == [x] and torch.equal(grads[x], torch.full((3,), 3.0))


def test_a_script_module_travels_through_a_python_call():
    module = rpc.rpc_sync("worker1", funcs.make_script_module, args=(2.5,))
    assert isinstance(module, torch.jit.ScriptModule) and torch.equal(module(X), X * 2.5)
    rref = rpc.remote("worker1", funcs.make_script_module, args=(4.0,))
    assert torch.equal(rref.rpc_sync().forward(X), X * 4.0)


# ---- @async_execution ----------------------------------------------------------------

def test_async_execution_python_function():
    # worker1 has one thread: the function returns its future and frees it,
    # so the call it makes to itself can run.
    out = rpc.rpc_sync("worker1", funcs.async_add_chained, args=("worker1", X, X, 1), timeout=20)
    assert torch.equal(out, X + X + 1)
    fut = rpc.rpc_async("worker2", funcs.async_add_chained, args=("worker1", X, X, 2), timeout=20)
    assert torch.equal(fut.wait(), X + X + 2)


def test_async_execution_script_function():
    out = rpc.rpc_sync("worker1", funcs.async_script_add, args=("worker2", X, X), timeout=20)
    assert torch.equal(out, X + X)
    out = rpc.rpc_sync("worker1", funcs.async_script_add, args=("worker1", X, X), timeout=20)  # itself, 1 thread
    assert torch.equal(out, X + X)


@pytest.mark.parametrize("method", ["static", "class", "bound"])
def test_async_execution_static_class_and_bound_methods(method):
    fn = {"static": funcs.AsyncMath.static_async_add, "class": funcs.AsyncMath.class_async_add,
          "bound": lambda to, x, y, z: None}[method]
    if method == "bound":
        fn, args = funcs.AsyncMath(5).bound_async_add, ("worker1", X, X)
    else:
        args = ("worker1", X, X, 5)
    assert torch.equal(rpc.rpc_sync("worker1", fn, args=args, timeout=20), X + X + 5)


def test_async_execution_must_return_a_future():
    with pytest.raises(RuntimeError, match="async_returns_a_value.*must return a torch.futures.Future"):
        rpc.rpc_sync("worker1", funcs.async_returns_a_value)


def test_async_execution_error_in_the_future_reaches_the_caller():
    with pytest.raises(RuntimeError, match="worker1"):
        rpc.rpc_sync("worker1", funcs.async_add_chained, args=("worker2", X, torch.ones(2), 1), timeout=20)


@pytest.mark.parametrize("how", ["rpc_sync", "rpc_async", "remote"])
def test_async_execution_script_function_without_future_fails_when_called(how):
    # Decorating it was fine (the module imported); each way of calling fails.
    fn, args = funcs.async_script_returns_a_tensor, (X,)
    with pytest.raises(RuntimeError, match="async_script_returns_a_tensor.*must return a Future.*got Tensor"):
        if how == "rpc_sync":
            rpc.rpc_sync("worker1", fn, args=args)
        elif how == "rpc_async":
            rpc.rpc_async("worker1", fn, args=args).wait()
        else:
            rpc.remote("worker1", fn, args=args).to_here()


# ---- deployment ---------------------------------------------------------------------

def test_saved_module_runs_after_load_on_another_worker(tmp_path):
    module = torch.jit.script(funcs.Shards(["worker1", "worker0"]))
    assert torch.equal(module(X), X * 6)
    path = str(tmp_path / "shards.pt")
    module.save(path)
    # worker2 loads it and runs it (from Python, so it blocks worker2's only
    # thread meanwhile: its shards are other workers)
    assert torch.equal(rpc.rpc_sync("worker2", funcs.load_and_run, args=(path, X), timeout=20), X * 6)


def test_saved_module_loads_in_a_fresh_process(tmp_path):
    path = str(tmp_path / "shards.pt")
    torch.jit.script(funcs.Shards(["worker1"])).save(path)
    code = (
        "import sys, torch\n"
        "import torchrpc\n"
        "m = torch.jit.load(sys.argv[1])\n"
        "try:\n"
        "    m(torch.ones(1))\n"
        "except Exception as e:\n"
        "    print('CALL FAILED:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120,
                         cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    # loading worked; the call needs init_rpc, and says so
    assert "torchrpc is not initialized in this process" in out.stdout
    without = subprocess.run([sys.executable, "-c", "import sys, torch; torch.jit.load(sys.argv[1])", path],
                             capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    # without torchrpc, torch's error points at a line that says what to do
    assert without.returncode != 0 and "Unknown builtin op: torchrpc::rpc_async" in without.stderr
    assert rpc.jit_ops.LOAD_HINT in without.stderr


# ---- shipped code: callees that lack the source ------------------------------------

SHIPPED_SOURCE = '''
import torch
import torchrpc

@torch.jit.script
def helper(x: torch.Tensor) -> torch.Tensor:
    return x * 7

@torch.jit.script
def shipped(x: torch.Tensor, k: int = 2) -> torch.Tensor:
    return helper(x) + k

@torch.jit.script
def fetch_times(rref: torchrpc.RRef, k: float) -> torch.Tensor:
    value = rref.to_here()
    assert isinstance(value, torch.Tensor)
    return value * k
'''


@pytest.fixture(scope="module")
def unseen(tmp_path_factory):
    """A module only this process can import: workers cannot resolve its
    script functions by name, so calls must ship their code."""
    folder = tmp_path_factory.mktemp("only_here")
    (folder / "only_here_fns.py").write_text(SHIPPED_SOURCE)
    sys.path.insert(0, str(folder))
    try:
        import only_here_fns
        yield only_here_fns
    finally:
        sys.path.remove(str(folder))


def test_unseen_script_function_is_shipped_once_and_cached(unseen):
    assert torch.equal(rpc.rpc_sync("worker1", unseen.shipped, args=(X,)), X * 7 + 2)
    names = rpc.rpc_sync("worker1", funcs.debug_info)["script_functions"]
    shipped = [n for n in names if n.startswith("sha1:")]
    assert len(shipped) == 1
    # later calls (defaults and kwargs filled in by the caller) carry only the hash
    for k in range(3):
        assert torch.equal(rpc.rpc_sync("worker1", unseen.shipped, args=(X,), kwargs={"k": k}), X * 7 + k)
    assert torch.equal(rpc.rpc_async("worker2", unseen.shipped, args=(X, 5)).wait(), X * 7 + 5)
    assert [n for n in rpc.rpc_sync("worker1", funcs.debug_info)["script_functions"] if n.startswith("sha1:")] == shipped


def test_unseen_script_function_with_a_python_rref_argument_is_shipped(unseen):
    # The first try sends the RRef as its TorchScript object, by name; the
    # resend with the code, after the callee lacked it, converts it again.
    rref = rpc.remote("worker1", torch.add, args=(X, 1))
    assert torch.equal(rpc.rpc_sync("worker2", unseen.fetch_times, args=(rref, 3.0)), (X + 1) * 3)


def test_unseen_script_function_inside_python_arguments_fails_clearly(unseen):
    # Inside the arguments of a Python call, script functions travel by name.
    with pytest.raises(Exception, match="no TorchScript function named '__torch__.only_here_fns.helper'"):
        rpc.rpc_sync("worker2", funcs.call, args=("worker0", unseen.helper, (X,)))


def test_shipped_code_hash_or_format_mismatch_is_refused(unseen):
    from torchrpc import shipped_code
    from torchrpc._extension import native

    agent = rpc.state.current().agent
    fmt, digest, code = shipped_code.with_code(unseen.helper, 1)
    for shipped, match in [
        ((fmt, "0" * 40, code), "refusing to run it"),
        (("torchscript-zip/0", digest, code), "run the same torchrpc version on every worker"),
    ]:
        message = native().script_message("helper", "", unseen.helper, (X,), {}, shipped, False)
        call = agent.send(1, message, 10.0, "rpc_sync", "helper")
        ok, info = call.result()
        assert not ok and info[2] == "ValueError" and match in info[1], info


def _rezipped(code, deflate=False, replace=None, add=None):
    """The zip in `code` (a uint8 tensor) written again by Python's zipfile:
    records replaced or added (by their name under the archive's folder)."""
    src = zipfile.ZipFile(io.BytesIO(code.numpy().tobytes()))
    folder = src.infolist()[0].filename.split("/")[0]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, (replace or {}).get(info.filename.split("/", 1)[1], src.read(info)))
        for name, data in (add or {}).items():
            dst.writestr(f"{folder}/{name}", data)
    return out.getvalue()


def test_shipped_code_that_torch_would_trust_too_far_is_refused(unseen):
    # torch allocates what a zip record or a pickle declares before reading it:
    # a few KB could make the callee hold gigabytes.
    import hashlib

    from torchrpc import shipped_code
    from torchrpc._extension import native

    agent = rpc.state.current().agent
    fmt, _, code = shipped_code.with_code(unseen.helper, 1)
    archive = zipfile.ZipFile(io.BytesIO(code.numpy().tobytes()))
    constants = archive.read(next(n for n in archive.namelist() if n.endswith("/constants.pkl")))
    source = archive.read(next(n for n in archive.namelist() if n.endswith("/code/__torch__.py")))
    assert b"torch.mul(x, 7)" in source
    assert torch.jit.load(io.BytesIO(_rezipped(code, deflate=True)))(X).equal(X * 7)  # a rezipped one still loads
    cases = [
        # a record torch reads whole, deflated from 32 MB (its pickle ends early)
        (_rezipped(code, deflate=True, replace={"constants.pkl": constants + bytes(32 << 20)}),
         "bytes of records in an archive of"),
        # BINUNICODE declaring 2 GB, in the pickle torch reads first
        (_rezipped(code, replace={"data.pkl": b"\x80\x02X\x00\x00\x00\x80ab."}), "holds a malformed pickle, data.pkl"),
        (b"PK\x03\x04" + bytes(100), "is not a readable torch archive"),
        # 20,000 terms: torch's compiler recursed through them until SIGSEGV
        (_rezipped(code, replace={"code/__torch__.py": source.replace(b"torch.mul(x, 7)", b"x + " * 20000 + b"x")}),
         "levels deep at code/__torch__.py:"),
    ]
    for data, match in cases:
        shipped = (fmt, hashlib.sha1(data).hexdigest(), torch.frombuffer(bytearray(data), dtype=torch.uint8))
        message = native().script_message("helper", "", unseen.helper, (X,), {}, shipped, False)
        ok, info = agent.send(1, message, 10.0, "rpc_sync", "helper").result()
        assert not ok and info[2] == "ValueError" and match in info[1] and "worker1" in info[1], info
    assert torch.equal(rpc.rpc_sync("worker1", unseen.shipped, args=(X,)), X * 7 + 2)  # the callee still serves


@pytest.mark.parametrize("kind", ["rpc_sync", "rpc_async"])
def test_async_execution_method_through_rref_proxies(kind):
    # worker1 has one thread: the method's call to worker1 itself can only
    # run because the async method frees it
    math = rpc.remote("worker1", funcs.AsyncMath, args=(5,))
    out = getattr(math, kind)(timeout=20).bound_async_add("worker1", X, X)
    assert torch.equal(out if kind == "rpc_sync" else out.wait(), X + X + 5)
