"""Distributed autograd against a 3-worker job: gradients computed across
workers equal those of the same computation in one process, on several graph
shapes and through every kind of call; contexts are released everywhere;
errors and a worker dying in the backward pass surface on the caller.

worker1 and worker2 each own a parameter "w" (autograd_funcs.create_param);
the test process rebuilds the same values locally for the reference."""

import os
import signal
import threading
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


def test_a_builtin_call_whose_tensors_need_no_grad_stays_outside_the_context():
    # As upstream: such a call (rpc or remote) records nothing and the callee
    # does not join the context; one tensor that requires grad records it.
    plain, x = torch.ones(3, 3), leaf(1)
    with rpc.autograd.context():
        out = rpc.rpc_sync("worker1", torch.add, args=(plain, 1))
        made = rpc.remote("worker1", torch.mul, args=(plain, 2))
        with torch.no_grad():  # grad mode off: x needs no grad either
            rpc.rpc_sync("worker1", torch.add, args=(x, 1))
        mine = rpc.autograd._current_context()
        assert mine._known_worker_ids() == set()
        assert not mine._send_functions() and not mine._recv_functions()
        assert_close(out, plain + 1)
        assert not out.requires_grad
        y = rpc.rpc_sync("worker1", torch.add, args=(x, 1))
        assert y.grad_fn.name() == RECV
        mine = rpc.autograd._current_context()
        assert mine._known_worker_ids() == {1} and len(mine._send_functions()) == 1
    assert_close(made.to_here(), plain * 2)


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


def test_the_roots_part_of_the_graph_runs_on_the_thread_that_called_backward():
    """The split RNN's shape again: the gradient of the local part between
    the two calls comes back in a message while backward() waits, and that
    thread runs its pass, as local autograd would (its tensors are in that
    thread's caches), not a pool thread."""
    x = leaf(1)
    ran_on = []
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.mul_param, args=(x, "w"))
        middle = torch.sin(y)
        middle.register_hook(lambda grad: ran_on.append(threading.get_ident()))
        y = rpc.rpc_sync("worker1", P.mul_param, args=(middle, "w"))
        rpc.autograd.backward(ctx, [y.sum()])
        assert ran_on == [threading.get_ident()]
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


def test_calls_that_wait_for_an_rrefs_confirmation_still_record_their_gradients():
    # worker2 gets worker1's RRef from us, so its calls run later, once worker1
    # confirmed the fork: still inside our context, Python (with a nested call
    # back to worker1) and TorchScript alike.
    x = leaf(1)
    scale = rpc.remote("worker1", torch.mul, args=(torch.ones(3, 3), 3.0))
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker2", P.scale_by_rref, args=(scale, x))
        z = rpc.rpc_sync("worker2", P.script_scale_by_rref, args=(scale, x))
        rpc.autograd.backward(ctx, [(y * z).sum()])
        check(ctx, [x], [], ((3 * x) * (3 * x)).sum(), [x])


def test_rref_backward_in_a_context_starts_on_the_owner():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        rref = rpc.remote("worker1", P.scalar_loss, args=(x, "w"))
        rref.backward(ctx)
        w1 = w_of("worker1")
        check(ctx, [x], ["worker1"], (x * w1).sum(), [x, w1])


def test_rref_backward_without_a_context_only_on_the_owner():
    """As upstream: a local backward pass runs only where the value is; a user
    RRef needs a context, and a value that is not a tensor is refused."""
    rref = rpc.remote("worker1", P.scalar_loss, args=(torch.ones(3, 3, dtype=torch.float64), "w"))
    with pytest.raises(RuntimeError, match="User RRefs require 'dist_autograd_ctx_id' to be specified"):
        rref.backward()
    assert rpc.rpc_sync("worker1", P.dot_grad, args=("w",)) is None
    with rpc.autograd.context() as ctx:
        not_a_tensor = rpc.remote("worker1", funcs.py_add, args=(1, 1))
        with pytest.raises(RuntimeError, match="RRef should contain a tensor for .backward()"):
            not_a_tensor.backward(ctx)


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
    with pytest.raises(RuntimeError, match="does not exist on worker0.*Could not find autograd context"):
        rpc.autograd.get_gradients(ctx)


RECV = "torch::distributed::autograd::RecvRpcBackward"


def test_a_context_shows_the_graph_it_recorded_as_upstream_does():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.nested, args=(x, "w", "worker2", "w"))
        mine = rpc.autograd._current_context()
        assert mine._context_id() == ctx
        [send] = mine._send_functions().values()
        assert send.name() == "torch::distributed::autograd::SendRpcBackward"
        assert [fn.name() for fn, _ in send.next_functions] == ["torch::autograd::AccumulateGrad"]
        assert send.next_functions[0][0].variable is x
        [recv] = mine._recv_functions().values()
        assert y.grad_fn is recv and recv.name() == RECV
        assert mine._known_worker_ids() == {1}
        # worker1 received x (one RecvRpcBackward) and the response of
        # worker2; it sent x * w on and its result back.
        sends, recvs, known = rpc.rpc_sync("worker1", P.context_graph, args=(ctx,))
        assert sends == [["MulBackward0"], ["MulBackward0"]] and recvs == 2 and known == {2}
    with pytest.raises(RuntimeError, match="Could not find autograd context"):
        rpc.autograd._retrieve_context(ctx)
    with pytest.raises(RuntimeError, match="valid autograd context"):
        rpc.autograd._current_context()


def test_concurrent_first_calls_of_a_function_record_one_send_each():
    # Until worker1 has answered a call of a Python function, every call sends
    # the whole function: one sent by hash could overtake it and be resent,
    # recording a second send function for one call.
    scale = float(time.time() % 1000)
    ballast = bytes(4 << 20)  # a function that takes a while to receive and decode

    def times_scale(t):
        return t * scale + len(ballast) * 0

    x = leaf(1)
    with rpc.autograd.context() as ctx:
        futs = [rpc.rpc_async("worker1", times_scale, args=(x,)) for _ in range(16)]
        for f in futs:
            assert_close(f.wait(), x * scale)
        assert len(rpc.autograd._current_context()._send_functions()) == 16
        sends, recvs, _ = rpc.rpc_sync("worker1", P.context_graph, args=(ctx,))
        assert len(sends) == 16 and recvs == 16


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
        with pytest.raises(RuntimeError, match=r"^Error on Node 1: boom in the backward pass \(raised on worker1"):
            rpc.autograd.backward(ctx, [y.sum()])


def test_an_error_deep_in_the_chain_reaches_the_root_as_raised():
    """The failing node is on the root, reached through worker1 and worker2:
    the error comes back as raised there, relayed, not wrapped once per hop."""
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = P.fails_in_backward(x)
        y = rpc.rpc_sync("worker1", P.mul_param, args=(y, "w"))
        y = rpc.rpc_sync("worker2", P.mul_param, args=(y, "w"))
        with pytest.raises(RuntimeError) as raised:
            rpc.autograd.backward(ctx, [y.sum()])
    assert str(raised.value) == ("Error on Node 0: boom in the backward pass "
                                 "(raised on worker0 while running 'torchrpc.autograd.backward')")


def test_a_custom_function_on_the_callee_backpropagates():
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.cube_param, args=(x, "w"))
        rpc.autograd.backward(ctx, [(y * y).sum()])
        w1 = w_of("worker1")
        check(ctx, [x], ["worker1"], ((x * w1) ** 6).sum(), [x, w1])


def test_a_custom_function_that_fails_fails_each_pass_the_same_then_recovers():
    """A Python error in a node's backward leaves nothing behind on the
    callee's threads: every later pass fails with the same error, not another."""
    x = leaf(1)
    rpc.rpc_sync("worker1", P.set_cube_fails, args=(True,))
    try:
        with rpc.autograd.context() as ctx:
            loss = rpc.rpc_sync("worker1", P.cube_param, args=(x, "w")).sum()
            for _ in range(6):
                with pytest.raises(RuntimeError, match=r"^Error on Node 1: the custom Function's backward failed on "
                                                       r"purpose \(raised on worker1"):
                    rpc.autograd.backward(ctx, [loss], retain_graph=True)
            rpc.rpc_sync("worker1", P.set_cube_fails, args=(False,))
            rpc.autograd.backward(ctx, [loss])
            w1 = w_of("worker1")
            check(ctx, [x], ["worker1"], ((x * w1) ** 3).sum(), [x, w1])
    finally:
        rpc.rpc_sync("worker1", P.set_cube_fails, args=(False,))


def test_post_hooks_of_a_leaf_run_once_with_its_gradient():
    """As in local autograd: each post hook of the leaf's AccumulateGrad node
    runs once per pass, with no outputs and the leaf's gradient as input."""
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.with_leaf_hooks, args=(x, "w"))
        rpc.autograd.backward(ctx, [y.sum()])
        calls = rpc.rpc_sync("worker1", P.leaf_hook_calls)
        assert [(tag, n) for tag, n, _ in calls] == [("a", 0), ("b", 0)]
        for _, _, (grad,) in calls:
            assert_close(grad, x.detach())
        assert_close(remote_grad(ctx, "worker1"), x.detach())
    t = torch.rand(3, 3, requires_grad=True)
    a = t + t  # both edges lead to t's AccumulateGrad: its hooks still run once
    counts = []
    acc = a.grad_fn.next_functions[0][0]
    acc.register_hook(lambda grad_inputs, grad_outputs: counts.append(1))
    acc.register_hook(lambda grad_inputs, grad_outputs: counts.append(2))
    with rpc.autograd.context() as ctx:
        rpc.autograd.backward(ctx, [a.sum()])
        assert counts == [1, 2]
        assert_close(rpc.autograd.get_gradients(ctx)[t], torch.full((3, 3), 2.0))


def test_a_gradient_nobody_else_holds_is_kept_without_a_copy():
    """torch's AccumulateGrad rules: the context keeps the tensor a node
    produced when nothing else holds it; it copies one that is shared (two
    leaves getting the same tensor) or not laid out as the leaf is."""
    a = torch.randn(5, 6, requires_grad=True)
    b = torch.randn(5, 6, requires_grad=True)
    with rpc.autograd.context() as ctx:
        rpc.autograd.backward(ctx, [_SeeGrad.apply(a)[1][0]])
        grads = rpc.autograd.get_gradients(ctx)
        assert grads[a].data_ptr() == _SeeGrad.seen_ptr
    with rpc.autograd.context() as ctx:
        rpc.autograd.backward(ctx, [_SeeGradTwice.apply(a, b)[1][0]])
        grads = rpc.autograd.get_gradients(ctx)
        assert len({grads[a].data_ptr(), grads[b].data_ptr(), _SeeGradTwice.seen_ptr}) == 3
        assert_close(grads[a], grads[b])
    with rpc.autograd.context() as ctx:
        rpc.autograd.backward(ctx, [_ExpandedGrad.apply(a)])
        grads = rpc.autograd.get_gradients(ctx)
        assert grads[a].is_contiguous()
        assert_close(grads[a], torch.ones(5, 6))


class _SeeGrad(torch.autograd.Function):
    seen_ptr = None

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _SeeGrad.seen_ptr = grad.data_ptr()
        return grad


class _SeeGradTwice(torch.autograd.Function):
    seen_ptr = None

    @staticmethod
    def forward(ctx, x, y):
        return x + y

    @staticmethod
    def backward(ctx, grad):
        _SeeGradTwice.seen_ptr = grad.data_ptr()
        return grad, grad


class _ExpandedGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.sum()

    @staticmethod
    def backward(ctx, grad):
        return torch.ones(1).expand(ctx.shape)  # a non-contiguous gradient


def test_bad_input_is_explained():
    """Each with our words and upstream's phrase, in upstream's exception class."""
    x = leaf(1)
    with rpc.autograd.context() as ctx:
        y = rpc.rpc_sync("worker1", P.mul_param, args=(x, "w"))
        with pytest.raises(RuntimeError, match="roots must be scalars.*all roots need to be scalar"):
            rpc.autograd.backward(ctx, [y])
        with pytest.raises(RuntimeError, match="does not require grad.*requires_grad not set on root"):
            rpc.autograd.backward(ctx, [torch.zeros(())])
        with pytest.raises(RuntimeError, match="is a leaf.*does not have a valid gradient function"):
            rpc.autograd.backward(ctx, [x[0, 0].detach().requires_grad_()])
        with pytest.raises(RuntimeError, match="at least one root.*No tensors provided"):
            rpc.autograd.backward(ctx, [])
        with pytest.raises(TypeError, match="list of tensors.*got Tensor"):
            rpc.autograd.backward(ctx, y.sum())
        with pytest.raises(TypeError, match="incompatible function arguments.*got NoneType"):
            rpc.autograd.backward(ctx, None)
        with pytest.raises(TypeError, match="incompatible function arguments.*int context_id"):
            rpc.autograd.backward(None, [y.sum()])
        with pytest.raises(RuntimeError, match="context 12345 does not exist.*Could not find autograd context with id: 12345"):
            rpc.autograd.backward(12345, [y.sum()])
        with pytest.raises(RuntimeError, match="cannot be nested.*Already have an autograd context id for this thread"):
            with rpc.autograd.context():
                pass
        with pytest.raises(RuntimeError, match=r"torchrpc.autograd.backward\(context_id"):
            y.sum().backward()


def test_script_callee_backward_runs_while_the_callee_holds_the_gil():
    x, w = leaf(1), leaf(2)
    rpc.rpc_sync("worker1", P.script_scale, args=(x, w))  # its name is looked up once, in Python
    with funcs.gil_held_on("worker1", "forward and backward"):
        with rpc.autograd.context() as ctx:
            for _ in range(5):
                y = rpc.rpc_sync("worker1", P.script_scale, args=(x, w), timeout=10)
                rpc.autograd.backward(ctx, [y.sum()])
            grads = rpc.autograd.get_gradients(ctx)
    expected = torch.autograd.grad((torch.tanh(x * w) + w).sum(), [x, w])
    assert_close(grads[x], 5 * expected[0])
    assert_close(grads[w], 5 * expected[1])


def test_ctrl_c_ends_a_wait_in_backward():
    """As for a call (test_calls): the wait gives way to Python's signal
    handlers; the pass goes on without it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        x = leaf(1)
        with rpc.autograd.context() as ctx:
            y = rpc.rpc_sync("worker1", P.slow_in_backward, args=(x, 3.0))
            started = time.monotonic()
            threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT)).start()
            with pytest.raises(KeyboardInterrupt):
                rpc.autograd.backward(ctx, [y.sum()])
            assert time.monotonic() - started < 2
    finally:
        signal.signal(signal.SIGINT, previous)


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
