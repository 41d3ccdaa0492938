"""RRefs inside TorchScript: the custom class torch.classes.torchrpc.RRef,
torchrpc.remote() from scripted code, RRefs as arguments and results of
TorchScript and builtin calls (to the owner, to a third worker, back), exact
reference counting, errors, rref.remote() with @async_execution, and
deployment of a module that calls remote() (save, load elsewhere). Every test
ends with no owner RRef it made left on any worker."""

import os
import subprocess
import sys

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs, rref_funcs
from tests.multiprocess.cluster import ROOT, Cluster, free_port
from tests.multiprocess.test_rref import WORKERS, owners_everywhere, settle

X = torch.arange(3.0)


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3) as c:
        yield c


@pytest.fixture(autouse=True)
def no_leaks():
    before = owners_everywhere()
    yield
    settle()
    after = owners_everywhere()
    assert {name: sorted(set(after[name]) - set(before[name])) for name in WORKERS} == {
        name: [] for name in WORKERS}
    # no user RRef outlives the test anywhere either
    assert [rpc.rpc_sync(name, rref_funcs.live_rref_counts)[1] for name in WORKERS[1:]] == [0, 0]
    assert rref_funcs.live_rref_counts()[1] == 0
    assert rpc.api._debug_info()["pending_requests"] == 0


# ---- the class and remote() in script ------------------------------------------------

def test_remote_in_script_returns_an_rref_usable_in_script_and_python():
    script_rref = rref_funcs.script_remote("worker1", X)  # a scripted function, called directly
    assert isinstance(script_rref, torch.ScriptObject)
    assert rref_funcs.script_rref_info(script_rref) == ("worker1", False)
    assert torch.equal(rref_funcs.script_to_here(script_rref), X + X)
    rref = rpc.RRef.from_script(script_rref)
    assert isinstance(rref, rpc.RRef) and rref.owner_name() == "worker1"
    assert torch.equal(rref.to_here(), X + X)
    # both sides share one reference: the owner sees one fork
    settle()
    assert len(rpc.rpc_sync("worker1", rref_funcs.live_rrefs)["owners"]) == 1
    del script_rref, rref


def test_script_methods_on_the_owner():
    rref = rpc.remote("worker1", rref_funcs.script_remote, args=("worker1", X))  # remote() to self on worker1
    value = rref.to_here()  # the RRef that script_remote returned, now a user here
    assert isinstance(value, rpc.RRef) and value.owner_name() == "worker1"
    info = rpc.rpc_sync("worker1", rref_funcs.script_rref_info, args=(value,))
    assert info == ("worker1", True)
    assert torch.equal(rpc.rpc_sync("worker1", rref_funcs.script_local_value, args=(value,)), X + X)
    assert torch.equal(rpc.rpc_sync("worker1", rref_funcs.script_to_here, args=(value,)), X + X)


def test_eager_remote_by_name_is_the_same_spelling():
    rref = rpc.remote("worker2", "tests.add", args=(X, X))
    assert torch.equal(rref.to_here(), X + X)
    assert torch.equal(rref_funcs.script_remote_then_fetch("worker2", X), (X + X) * 2)
    assert torch.equal(rref_funcs.script_remote_then_fetch("worker0", X), (X + X) * 2)  # owner: this worker


def test_script_rref_annotations_accept_python_rrefs_through_rpc():
    rrefs = [rpc.remote(w, funcs.add, args=(X, X)) for w in ("worker1", "worker2", "worker0")]
    assert torch.equal(rpc.rpc_sync("worker1", rref_funcs.script_sum_rrefs, args=(rrefs,)), X * 6)
    assert torch.equal(rref_funcs.script_sum_rrefs([r.to_script() for r in rrefs]), X * 6)


def test_confirmed_by_owner_in_script():
    rref = rpc.remote("worker1", funcs.add, args=(X, X))
    rref._get_future().wait()  # remote() answered: the owner knows this user
    assert rref_funcs.script_rref_confirmed(rref.to_script())
    assert rref_funcs.script_rref_confirmed(rpc.RRef(X).to_script())  # the owner's own


def test_a_script_call_that_receives_a_third_workers_rref_runs_once_the_owner_confirmed_it():
    # worker2 gets worker1's RRef from us: as upstream, the call (and remote()'s
    # creating call) runs only once worker1 answered worker2's fork request.
    # Without the wait it reads True about 1 time in 10 here: 5 fresh RRefs each.
    rrefs = [rpc.remote("worker1", funcs.add, args=(X, X)) for _ in range(5)]
    assert [rpc.rpc_sync("worker2", rref_funcs.script_rref_confirmed, args=(r,)) for r in rrefs] == [True] * 5
    rrefs = [rpc.remote("worker1", funcs.add, args=(X, X)) for _ in range(5)]
    assert [rpc.remote("worker2", rref_funcs.script_rref_confirmed, args=(r,)).to_here() for r in rrefs] == [True] * 5
    assert torch.equal(rpc.rpc_sync("worker2", rref_funcs.script_to_here, args=(rrefs[0],)), X + X)


# ---- RRefs as arguments and results ---------------------------------------------------

def test_python_rref_as_argument_of_a_script_call_to_the_owner():
    rref = rpc.remote("worker1", funcs.add, args=(X, X))
    assert torch.equal(rpc.rpc_sync("worker1", rref_funcs.script_to_here, args=(rref,)), X + X)
    assert torch.equal(rpc.rpc_sync("worker1", rref_funcs.script_local_value, args=(rref,)), X + X)
    assert rpc.rpc_sync("worker1", "tests.script_to_here", args=(rref,)).equal(X + X)  # by name


@pytest.mark.parametrize("kind", ["rpc_sync", "rpc_async"])
def test_a_script_call_with_an_rref_argument_that_raises_runs_once(kind):
    # The Python RRef is retried as its TorchScript object only when building
    # the message failed on it; the callee's own RuntimeError must not send it
    # again. (rpc_async: the failed future must not keep this frame, and so
    # `counter`, alive: the module's leak check.)
    counter = rpc.remote("worker1", torch.zeros, args=([3],))
    with pytest.raises(RuntimeError, match="bumped, then raised"):
        out = getattr(rpc, kind)("worker1", rref_funcs.script_bump_then_raise, args=(counter,))
        if kind == "rpc_async":
            out.wait()
    assert torch.equal(counter.to_here(), torch.ones(3))


def test_rref_as_argument_of_a_script_call_to_a_third_worker():
    rref = rpc.remote("worker1", funcs.add, args=(X, X))
    assert rpc.rpc_sync("worker2", rref_funcs.script_rref_info, args=(rref,)) == ("worker1", False)
    assert torch.equal(rpc.rpc_async("worker2", rref_funcs.script_to_here, args=(rref,)).wait(), X + X)
    # worker2 hands it on to worker0 (us) from TorchScript
    assert torch.equal(rpc.rpc_sync("worker2", rref_funcs.script_forward_rref, args=(rref, "worker0")), X + X)
    # an owner RRef sent by its owner
    mine = rpc.RRef(X * 5)
    assert torch.equal(rpc.rpc_sync("worker2", rref_funcs.script_to_here, args=(mine,)), X * 5)


def test_rref_as_result_of_a_script_call():
    rref = rpc.rpc_sync("worker1", rref_funcs.script_remote, args=("worker2", X))  # owned by worker2
    assert isinstance(rref, rpc.RRef)
    assert rref.owner_name() == "worker2" and not rref.is_owner()
    assert torch.equal(rref.to_here(), X + X)
    back = rpc.rpc_sync("worker1", rref_funcs.script_remote, args=("worker0", X))  # owned by us
    assert isinstance(back, rpc.RRef) and back.is_owner()
    assert torch.equal(back.local_value(), X + X)


def test_rref_as_argument_of_a_builtin_call():
    # remote() is itself an op: called as a builtin on worker1, it returns an RRef
    rref = rpc.rpc_sync("worker1", rpc.remote, args=("worker2", "tests.add", (X, X)))
    assert isinstance(rref, rpc.RRef) and rref.owner_name() == "worker2"
    assert torch.equal(rref.to_here(), X + X)


def test_script_rref_object_inside_a_python_call():
    script_rref = rref_funcs.script_remote("worker2", X)
    assert torch.equal(rpc.rpc_sync("worker1", rref_funcs.rref_to_here, args=(script_rref,)), X + X)


def test_reference_counts_are_exact():
    rref = rpc.rpc_sync("worker1", rref_funcs.script_remote, args=("worker2", X))
    for name in ("worker1", "worker0"):
        assert torch.equal(rpc.rpc_sync(name, rref_funcs.script_to_here, args=(rref,)), X + X)
    settle()
    owners = rpc.rpc_sync("worker2", rref_funcs.live_rrefs)["owners"]
    assert len(owners) == 1 and len(owners[0][1]) == 1  # only our fork is left
    del rref
    settle()
    assert rpc.rpc_sync("worker2", rref_funcs.live_rrefs)["owners"] == []


def test_many_rrefs_through_script_calls_leave_nothing_behind():
    futs = [rpc.rpc_async(w, rref_funcs.script_remote, args=(o, X)) for w in WORKERS for o in WORKERS]
    rrefs = [f.wait() for f in futs]
    assert torch.equal(rpc.rpc_sync("worker2", rref_funcs.script_sum_rrefs, args=(rrefs,)), X * 18)
    del rrefs, futs


# ---- errors -----------------------------------------------------------------------------

def test_local_value_on_a_user_names_the_owner():
    rref = rpc.remote("worker1", funcs.add, args=(X, X))
    with pytest.raises(RuntimeError, match="owned by worker1 and this worker is worker2.*to_here"):
        rpc.rpc_sync("worker2", rref_funcs.script_local_value, args=(rref,))
    with pytest.raises(RuntimeError, match="owned by worker1 and this worker is worker0"):
        rref_funcs.script_local_value(rref.to_script())


def test_failing_remote_creation_surfaces_on_to_here_with_the_owner():
    rref = rref_funcs.script_remote_failing("worker1", torch.ones(2))
    with pytest.raises(RuntimeError, match="(?s)positive input is not allowed here.*raised on worker1"):
        rref_funcs.script_to_here(rref)
    with pytest.raises(RuntimeError, match="(?s)positive input.*raised on worker1"):
        rpc.RRef.from_script(rref).to_here()


def test_unknown_worker_and_function_in_script_remote():
    with pytest.raises(Exception, match="no worker of this job is named 'nobody'"):
        rref_funcs.script_remote("nobody", X)
    rref = rpc.remote("worker1", "tests.nope", args=(X,))
    with pytest.raises(RuntimeError, match="no TorchScript function named 'tests.nope'"):
        rref.to_here()


def test_remote_timeout_surfaces_on_to_here_in_script():
    # The owner computes for a while (tens of ms), far longer than the 1 ms to_here allows.
    with pytest.raises(RuntimeError, match="timed out|not created"):
        rpc.rpc_sync("worker1", rref_funcs.script_remote_busy_then_fetch, args=("worker2", 50_000, 1e-3))


def test_rref_cannot_be_saved_with_a_module(tmp_path):
    class Holder(torch.nn.Module):
        def __init__(self, rref):
            super().__init__()
            self.rref = rref

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    rref = rpc.remote("worker1", funcs.add, args=(X, X))
    module = torch.jit.script(Holder(rref.to_script()))
    with pytest.raises(RuntimeError, match="can only be pickled by torchrpc"):
        module.save(str(tmp_path / "holder.pt"))
    del module


def test_python_value_cannot_reach_script():
    rref = rpc.remote("worker1", funcs.Counter, args=(1,))
    with pytest.raises(RuntimeError, match="(?s)is a Python object.*cannot receive.*raised on worker2"):
        rpc.rpc_sync("worker2", rref_funcs.script_to_here, args=(rref,))


# ---- rref.remote() with @async_execution -------------------------------------------------

def test_async_execution_method_through_rref_remote_proxy():
    math = rpc.remote("worker1", funcs.AsyncMath, args=(5,))
    out = math.remote(timeout=20).bound_async_add("worker1", X, X)
    assert isinstance(out, rpc.RRef) and out.owner_name() == "worker1"
    assert torch.equal(out.to_here(), X + X + 5)
    with pytest.raises(RuntimeError, match="worker1"):
        math.remote(timeout=20).bound_async_add("worker2", X, torch.ones(2)).to_here()


# ---- deployment -------------------------------------------------------------------------

def test_saved_module_calling_remote_runs_after_load_elsewhere(tmp_path):
    module = torch.jit.script(rref_funcs.RemoteDoubler("worker1"))
    assert torch.equal(module(X), X + X + 1)
    assert torch.equal(rpc.RRef.from_script(module.make(X)).to_here(), X + X)
    path = str(tmp_path / "doubler.pt")
    module.save(path)
    assert torch.equal(rpc.rpc_sync("worker2", funcs.load_and_run, args=(path, X), timeout=20), X + X + 1)


FRESH = '''
import sys, torch, torchrpc

@torch.jit.script
def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b

torchrpc.register("tests.add", add)
torchrpc.init_rpc("solo", rank=0, world_size=1,
                  rpc_backend_options=torchrpc.RpcOptions(init_method=sys.argv[2]))
m = torch.jit.load(sys.argv[1])
print("forward:", m(torch.arange(3.0)).tolist())
rref = torchrpc.RRef.from_script(m.make(torch.ones(2)))
print("make:", rref.is_owner(), rref.to_here().tolist())
del rref
torchrpc.shutdown()
print("live:", len(torchrpc.rref._live_rrefs()["owner_objects"]))
'''


def test_saved_module_calling_remote_loads_in_a_fresh_process(tmp_path):
    path = str(tmp_path / "doubler.pt")
    torch.jit.script(rref_funcs.RemoteDoubler("solo")).save(path)
    script = tmp_path / "fresh.py"
    script.write_text(FRESH)
    out = subprocess.run([sys.executable, str(script), path, f"tcp://127.0.0.1:{free_port()}"],
                         capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    assert "forward: [1.0, 3.0, 5.0]" in out.stdout, out.stdout
    assert "make: True [2.0, 2.0]" in out.stdout, out.stdout
    # without torchrpc, torch's error (on the RRef type) points at the hint
    without = subprocess.run([sys.executable, "-c", "import sys, torch; torch.jit.load(sys.argv[1])", path],
                             capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert without.returncode != 0 and "torchrpc.RRef" in without.stderr
    assert rpc.jit_ops.LOAD_HINT in without.stderr
