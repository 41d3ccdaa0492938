"""Profiling RPCs with torch's legacy autograd profiler: each call is one
range named as upstream names it, the callee's events come back under it
as remote events with the callee's node id (also through a nested call),
one Chrome trace holds both workers, and profiling composes with
distributed autograd."""

import json
import time

import pytest
import torch
from torch.autograd.profiler_legacy import profile

import torchrpc as rpc
from tests.multiprocess import profiler_funcs as F
from tests.multiprocess.cluster import Cluster


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3) as c:
        yield c


def named(events, name):
    return [e for e in events if e.name == name]


def one(events, name):
    found = named(events, name)
    assert len(found) == 1, f"{len(found)} events named {name!r} in {sorted({e.name for e in events})}"
    return found[0]


@pytest.mark.parametrize("kind", ["sync", "async", "remote"])
def test_a_builtin_call_and_its_remote_op(kind):
    x = torch.ones(4)
    with profile(record_shapes=True) as prof:
        if kind == "sync":
            rpc.rpc_sync("worker1", torch.mul, args=(x, x))
        elif kind == "async":
            rpc.rpc_async("worker1", torch.mul, args=(x, x)).wait()
        else:
            rref = rpc.remote("worker1", torch.mul, args=(x, x))
            rref.to_here()
            rref._get_profiling_future().wait()
    key = f"rpc_{kind}#aten::mul(worker0 -> worker1)"
    call = one(prof.function_events, key)
    assert call.node_id == 0 and not call.is_remote
    op = one(prof.function_events, key + "#remote_op: aten::mul")
    assert op.is_remote and op.node_id == 1
    assert op.input_shapes[:2] == [[4], [4]]  # record_shapes travelled


def test_a_python_call_with_a_range_on_the_callee():
    with profile() as prof:
        rpc.rpc_sync("worker2", F.mul_in_a_range, args=(torch.ones(2),))
    key = f"rpc_sync#{F.mul_in_a_range.__qualname__}(worker0 -> worker2)"
    one(prof.function_events, key)
    callee_range = one(prof.function_events, key + "#remote_op: ##callee_range##")
    assert callee_range.node_id == 2
    children = {c.name for c in callee_range.cpu_children}
    assert key + "#remote_op: aten::mul" in children


def test_a_script_call():
    with profile() as prof:
        rpc.rpc_sync("worker1", F.script_sub, args=(torch.ones(2),))
    names = {e.name for e in prof.function_events}
    keys = [n for n in names if n.startswith("rpc_sync#") and n.endswith("(worker0 -> worker1)")]
    assert len(keys) == 1 and "script_sub" in keys[0], names
    assert keys[0] + "#remote_op: aten::sub" in names


def test_a_nested_call_keeps_each_workers_node_id():
    with profile() as prof:
        rpc.rpc_sync("worker1", F.add_via, args=("worker2", torch.ones(2)))
    outer = f"rpc_sync#{F.add_via.__qualname__}(worker0 -> worker1)"
    inner = outer + "#remote_op: rpc_sync#aten::add(worker1 -> worker2)"
    assert one(prof.function_events, inner).node_id == 1
    assert one(prof.function_events, inner + "#remote_op: aten::add").node_id == 2


def test_one_chrome_trace_shows_both_workers(tmp_path):
    with profile() as prof:
        rpc.rpc_async("worker1", torch.mul, args=(torch.ones(2), 2)).wait()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    names = [e["name"] for e in trace]
    assert "rpc_async#aten::mul(worker0 -> worker1)" in names
    remote = [e for e in trace if e["name"] == "rpc_async#aten::mul(worker0 -> worker1)#remote_op: aten::mul"]
    assert len(remote) == 1 and "node_id:1" in str(remote[0]["tid"])


def test_profiling_inside_a_distributed_autograd_context():
    a = torch.ones(2, requires_grad=True)
    with rpc.autograd.context() as ctx, profile() as prof:
        y = rpc.rpc_sync("worker1", torch.mul, args=(a, 3.0))
        rpc.autograd.backward(ctx, [y.sum()])
        grads = rpc.autograd.get_gradients(ctx)
    assert torch.equal(grads[a], torch.full((2,), 3.0))
    one(prof.function_events, "rpc_sync#aten::mul(worker0 -> worker1)#remote_op: aten::mul")


@pytest.mark.parametrize("profiler", [profile, torch.autograd.profiler.profile], ids=["legacy", "kineto"])
def test_a_profiled_backward_shows_the_pass_its_rpc_functions_and_the_later_local_pass(profiler):
    # The root's pass after the gradients came back (a pool thread) runs under
    # the caller's profiler, as upstream's engine does: its MulBackward0 and
    # SendRpcBackward are in the profile, inside the whole backward's range.
    a = torch.ones(2, requires_grad=True)
    with rpc.autograd.context() as ctx:
        loss = rpc.rpc_sync("worker1", torch.add, args=(a * 2, 1.0)).sum()
        with profiler() as prof:
            rpc.autograd.backward(ctx, [loss])
        assert torch.equal(rpc.autograd.get_gradients(ctx)[a], torch.full((2,), 2.0))
    events = prof.function_events
    whole = one(events, "torch::distributed::autograd::backward")
    for name in ("torch::distributed::autograd::RecvRpcBackward", "torch::distributed::autograd::SendRpcBackward",
                 "MulBackward0"):
        event = one(events, name)
        assert whole.time_range.start <= event.time_range.start <= event.time_range.end <= whole.time_range.end


def test_a_failed_call_ends_its_range():
    with profile() as prof:
        with pytest.raises(ValueError):
            rpc.rpc_sync("worker1", int, args=("not a number",))
    call = one(prof.function_events, "rpc_sync#int(worker0 -> worker1)")
    assert call.time_range.end >= call.time_range.start
    assert not [e for e in prof.function_events if e.is_remote]  # an error carries no events, as upstream


def test_without_the_legacy_profiler_nothing_is_recorded():
    with torch.profiler.profile() as prof:  # the Kineto profiler: RPC profiling is off, as upstream
        rpc.rpc_sync("worker1", torch.mul, args=(torch.ones(2), 2))
    assert not [e for e in prof.events() if "rpc_sync#" in e.name]
    rpc.rpc_sync("worker1", torch.mul, args=(torch.ones(2), 2))  # no profiler at all: a plain call


def test_server_process_global_profiler():
    outer = rpc.remote("worker1", rpc._server_process_global_profile)
    outer.rpc_sync().__enter__()
    rpc.rpc_sync("worker1", torch.add, args=(torch.ones(1), 1))
    inner = rpc.remote("worker1", rpc._server_process_global_profile)
    inner.rpc_sync().__enter__()
    rpc.rpc_sync("worker1", torch.sub, args=(torch.ones(1), 1))
    # a value remote() creates is recorded too (its REMOTE_CALL leaves the I/O thread's fast path then)
    assert torch.equal(rpc.remote("worker1", torch.mul, args=(torch.ones(1), 3)).to_here(), torch.full((1,), 3.0))
    inner.rpc_sync().__exit__(None, None, None)
    outer.rpc_sync().__exit__(None, None, None)
    inner_events = [n for request in rpc.rpc_sync("worker1", F.global_profile_events, args=(inner,)) for n in request]
    outer_events = [n for request in rpc.rpc_sync("worker1", F.global_profile_events, args=(outer,)) for n in request]
    assert "aten::sub" in inner_events and "aten::mul" in inner_events and "aten::add" not in inner_events
    assert "aten::sub" in outer_events and "aten::add" in outer_events


def test_a_remote_to_oneself():
    with profile() as prof:
        rref = rpc.remote("worker0", torch.mul, args=(torch.ones(2), 3))
        rref.to_here()
        rref._get_profiling_future().wait()
    call = one(prof.function_events, "rpc_remote#aten::mul(worker0 -> worker0)")
    assert call.node_id == 0
    # the creation ran on a torchrpc thread, recorded in this profile
    assert [e for e in prof.function_events if e.name == "aten::mul" and e.thread != call.thread]


def test_a_callback_on_the_profiling_future_runs_on_the_callback_thread():
    # Added before remote()'s answer comes: it must not run on the I/O thread
    # that receives it, which never waits for the GIL.
    from torchrpc._extension import native

    with profile():
        rref = rpc.remote("worker1", time.sleep, args=(0.3,))
        fut = rref._get_profiling_future()
        on_callback_thread = fut.then(lambda f: native().on_callback_thread())
        assert not fut.done()
        assert on_callback_thread.wait() is True and fut.wait() is None
