"""Distributed autograd against a 3-worker job: gradients computed across
workers equal those of the same computation in one process, on several graph
shapes and through every kind of call; contexts are released everywhere;
errors and a worker dying in the backward pass surface on the caller.

worker1 and worker2 each own a parameter "w" (autograd_funcs.create_param);
the test process rebuilds the same values locally for the reference."""

import time

import pytest
import torch
from torch.testing import assert_close

import torchrpc as rpc
from torchrpc._extension import native
from tests.multiprocess import autograd_funcs as P
from tests.multiprocess import funcs
from tests.multiprocess.cluster import Cluster


def _backward_endings():
    """How this process's backward() calls ended: (by the passes' reports, by the responses)."""
    counters = native().debug_counters()
    return counters["backwards_ended_by_reports"], counters["backwards_ended_by_responses"]

SEEDS = {"worker1": 1, "worker2": 2}


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3) as c:
        for worker, seed in SEEDS.items():
            rpc.rpc_sync(worker, P.create_param, args=("w", (3, 3), seed))
        yield c


def w_of(worker):
    """A local copy of `worker`'s parameter, for the reference computation."""
    return P.make_param((3, 3), SEEDS[worker])


def leaf(seed):
    return P.make_param((3, 3), 100 + seed)


def remote_grad(context_id, worker):
    return rpc.rpc_sync(worker, P.gradient, args=(context_id, "w"))


def check(context_id, local, remote, reference_loss, reference_leaves):
    """`local` are this worker's leaves, `remote` the workers whose "w" took
    part; reference_leaves are local copies in the same order: local, then remote."""
    expected = torch.autograd.grad(reference_loss, reference_leaves)
    grads = rpc.autograd.get_gradients(context_id)
    for i, t in enumerate(local):
        assert_close(grads[t], expected[i])
        assert t.grad is None  # distributed autograd never touches .grad
    for j, worker in enumerate(remote):
        assert_close(remote_grad(context_id, worker), expected[len(local) + j])
        assert rpc.rpc_sync(worker, P.dot_grad, args=("w",)) is None


def test_builtin_call_as_in_the_design_note():
    t1, t2, t4 = leaf(1), leaf(2), leaf(4)
    with rpc.autograd.context() as ctx:
        t3 = rpc.rpc_sync("worker1", torch.add, args=(t1, t2))
        loss = (t3 * t4).sum()
        rpc.autograd.backward(ctx, [loss])
        check(ctx, [t1, t2, t4], [], ((t1 + t2) * t4).sum(), [t1, t2, t4])


def test_python_callee_with_a_remote_parameter():
    x, z = leaf(1), leaf(2)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.tanh_param, args=(x, "w"))
        rpc.autograd.backward(ctx, [(y * z).sum()])
        w1 = w_of("worker1")
        check(ctx, [x, z], ["worker1"], (torch.tanh(x @ w1) * z).sum(), [x, z, w1])


def test_script_callee_both_directions():
    x, w = leaf(1), leaf(2)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_async("worker1", P.script_scale, args=(x, w)).wait()
        rpc.autograd.backward(ctx, [(y ** 2).sum()])
        check(ctx, [x, w], [], ((torch.tanh(x * w) + w) ** 2).sum(), [x, w])


def test_nested_calls_a_b_c():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.nested, args=(x, "w", "worker2", "w"))
        rpc.autograd.backward(ctx, [y.sum()])
        w1, w2 = w_of("worker1"), w_of("worker2")
        check(ctx, [x], ["worker1", "worker2"], (x * w1 * w2 * w1).sum(), [x, w1, w2])


def test_fan_out_to_two_workers():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        a = rpc.rpc_async("worker1", P.mul_param, args=(x, "w"))
        b = rpc.rpc_async("worker2", P.mul_param, args=(x, "w"))
        rpc.autograd.backward(ctx, [(a.wait() * b.wait()).sum()])
        w1, w2 = w_of("worker1"), w_of("worker2")
        check(ctx, [x], ["worker1", "worker2"], ((x * w1) * (x * w2)).sum(), [x, w1, w2])


def test_a_parameter_used_twice_and_in_two_calls():
    x1, x2 = leaf(1), leaf(2)
    with rpc.autograd.context() as ctx:
        y1 = rpc.rpc_sync("worker1", P.param_twice, args=(x1, "w"))
        y2 = rpc.rpc_sync("worker1", P.param_twice, args=(x2, "w"))
        rpc.autograd.backward(ctx, [(y1 * y2).sum()])
        w1 = w_of("worker1")
        ref = (((x1 * w1).sin() + w1 * w1) * ((x2 * w1).sin() + w1 * w1)).sum()
        check(ctx, [x1, x2], ["worker1"], ref, [x1, x2, w1])


def test_a_tensor_sent_twice():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        h = x.exp()  # not a leaf: both sends share its node
        y1 = rpc.rpc_sync("worker1", P.mul_param, args=(h, "w"))
        y2 = rpc.rpc_sync("worker1", P.mul_param, args=(h, "w"))
        rpc.autograd.backward(ctx, [(y1 * y2).sum()])
        w1 = w_of("worker1")
        check(ctx, [x], ["worker1"], ((x.exp() * w1) * (x.exp() * w1)).sum(), [x, w1])


def test_several_calls_between_the_same_pair_and_back_to_the_caller():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = x
        for _ in range(3):
            y = rpc.rpc_sync("worker1", P.mul_param, args=(y, "w"))
            y = rpc.rpc_sync("worker0", torch.sin, args=(y,))  # a call to oneself
        rpc.autograd.backward(ctx, [y.sum()])
        w1 = w_of("worker1")
        ref = x
        for _ in range(3):
            ref = torch.sin(ref * w1)
        check(ctx, [x], ["worker1"], ref.sum(), [x, w1])


def test_backward_returns_when_the_last_pass_reports():
    """The split RNN's shape: the backward pass goes here -> worker1 -> here ->
    worker1 -> here. backward() returns when the last pass reports to it, not
    after the responses have travelled back along the chain, and every
    gradient is in place by then."""
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.mul_param, args=(x, "w"))
        y = rpc.rpc_sync("worker1", P.mul_param, args=(torch.sin(y), "w"))
        by_reports, by_responses = _backward_endings()
        rpc.autograd.backward(ctx, [y.sum()])
        assert _backward_endings() == (by_reports + 1, by_responses)
        w1 = w_of("worker1")
        check(ctx, [x], ["worker1"], (torch.sin(x * w1) * w1).sum(), [x, w1])


def test_remote_and_to_here():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        rref = rpc.remote("worker1", P.mul_param, args=(x, "w"))
        y = rref.to_here()
        rpc.autograd.backward(ctx, [(y * y).sum()])
        w1 = w_of("worker1")
        check(ctx, [x], ["worker1"], ((x * w1) * (x * w1)).sum(), [x, w1])


def test_rref_backward_in_a_context_starts_on_the_owner():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        rref = rpc.remote("worker1", P.scalar_loss, args=(x, "w"))
        rref.backward(ctx)
        w1 = w_of("worker1")
        check(ctx, [x], ["worker1"], (x * w1).sum(), [x, w1])


def test_rref_backward_without_a_context_is_local_on_the_owner():
    rref = rpc.remote("worker1", P.scalar_loss, args=(torch.ones(3, 3, dtype=torch.float64), "w"))
    try:
        rref.backward()
        assert_close(rpc.rpc_sync("worker1", P.dot_grad, args=("w",)),
                     torch.ones(3, 3, dtype=torch.float64))
    finally:
        rpc.rpc_sync("worker1", P.clear_dot_grad, args=("w",))


def test_retain_graph_lets_backward_run_again():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.mul_param, args=(x, "w"))
        loss = (y * y).sum()
        rpc.autograd.backward(ctx, [loss], retain_graph=True)
        rpc.autograd.backward(ctx, [loss])
        w1 = w_of("worker1")
        once = torch.autograd.grad(((x * w1) * (x * w1)).sum(), [x, w1])
        assert_close(rpc.autograd.get_gradients(ctx)[x], 2 * once[0])
        assert_close(remote_grad(ctx, "worker1"), 2 * once[1])
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            rpc.autograd.backward(ctx, [loss])


def test_contexts_are_released_on_every_worker():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.nested, args=(x, "w", "worker2", "w"))
        rpc.autograd.backward(ctx, [y.sum()])
        for worker in ("worker1", "worker2"):
            assert ctx in rpc.rpc_sync(worker, P.live_contexts)
    assert ctx not in rpc.autograd._live_contexts()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [w for w in ("worker1", "worker2") if ctx in rpc.rpc_sync(w, P.live_contexts)]
        if not left:
            break
        time.sleep(0.01)
    assert left == []
    with pytest.raises(ValueError, match="does not exist on worker0"):
        rpc.autograd.get_gradients(ctx)


def test_an_open_context_without_traffic_uses_no_cpu():
    # While a context is open, waits poll for up to 2 ms after each message
    # (the training budget, csrc/common/spin.h); past that everyone sleeps.
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.nested, args=(x, "w", "worker2", "w"))
        rpc.autograd.backward(ctx, [y.sum()])
        time.sleep(0.05)
        before = {w: rpc.rpc_sync(w, P.cpu_seconds) for w in ("worker1", "worker2")}
        mine = time.process_time()
        time.sleep(1.0)
        used = {w: rpc.rpc_sync(w, P.cpu_seconds) - before[w] for w in before}
        used["worker0"] = time.process_time() - mine
    # Each worker answered one call in the second (a few ms of polling at most).
    assert all(seconds < 0.05 for seconds in used.values()), used


def test_context_ids_are_unique_across_the_job():
    with rpc.autograd.context() as mine:
        pass
    theirs = rpc.rpc_sync("worker1", _open_context)
    assert mine != theirs
    assert rpc.autograd._current_context_id() == -1


def _open_context():
    with rpc.autograd.context() as ctx:
        return ctx


def test_an_error_in_a_remote_backward_names_the_worker():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.fails_in_backward, args=(x,))
        with pytest.raises(RuntimeError, match="boom in the backward pass.*raised on worker1"):
            rpc.autograd.backward(ctx, [y.sum()])


def test_bad_input_is_explained():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.mul_param, args=(x, "w"))
        with pytest.raises(ValueError, match="roots must be scalars"):
            rpc.autograd.backward(ctx, [y])
        with pytest.raises(ValueError, match="does not require grad"):
            rpc.autograd.backward(ctx, [torch.zeros(())])
        with pytest.raises(TypeError, match="list of tensors"):
            rpc.autograd.backward(ctx, y.sum())
        with pytest.raises(ValueError, match="context 12345 does not exist"):
            rpc.autograd.backward(12345, [y.sum()])
        with pytest.raises(RuntimeError, match="cannot be nested"):
            with rpc.autograd.context():
                pass
        with pytest.raises(RuntimeError, match=r"torchrpc.autograd.backward\(context_id"):
            y.sum().backward()


def test_script_callee_backward_runs_while_the_callee_holds_the_gil():
    x, w = leaf(1), leaf(2)
    rpc.rpc_sync("worker1", P.script_scale, args=(x, w))  # its name is looked up once, in Python
    hold = 3.0
    rpc.rpc_sync("worker1", funcs.hold_gil_on_main, args=(hold,))
    time.sleep(0.5)
    started = time.time()
    with rpc.autograd.context() as ctx:
        for _ in range(5):
            y = rpc.rpc_sync("worker1", P.script_scale, args=(x, w), timeout=10)
            rpc.autograd.backward(ctx, [y.sum()])
        grads = rpc.autograd.get_gradients(ctx)
    finished = time.time()
    rpc.rpc_sync("worker1", funcs.pid, timeout=10)  # after the hold
    start, end = rpc.rpc_sync("worker1", funcs.hold_window)
    assert start <= started and finished <= end, (
        f"forward and backward ran from {started:.3f} to {finished:.3f}; worker1 held its GIL "
        f"from {start:.3f} to {end:.3f}")
    expected = torch.autograd.grad((torch.tanh(x * w) + w).sum(), [x, w])
    assert_close(grads[x], 5 * expected[0])
    assert_close(grads[w], 5 * expected[1])


def test_a_worker_dying_in_the_backward_pass_fails_it_promptly(job):
    # Last: it kills worker2.
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker2", P.dies_in_backward, args=(x,))
        started = time.monotonic()
        with pytest.raises(rpc.PeerUnreachableError, match="worker2"):
            rpc.autograd.backward(ctx, [y.sum()])
        assert time.monotonic() - started < 5
    # Its connection closes before its process is gone: wait, so that the
    # job's teardown knows worker2 is dead and does not shut down gracefully.
    assert job.procs[2].wait(timeout=10) == 3
