"""Remote functions of the distributed autograd tests. Each worker keeps its
own parameters (leaves that require grad) by name, made from a seed, so the
test process can build the same values locally and compare gradients."""

import os

import threading
import time

import torch

import torchrpc as rpc

_params = {}


def make_param(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_()


def create_param(name, shape, seed):
    _params[name] = make_param(shape, seed)


def mul_param(x, name):
    return x * _params[name]


def tanh_param(x, name):
    return torch.tanh(x @ _params[name])


def scalar_loss(x, name):
    return (x * _params[name]).sum()


def param_twice(x, name):
    """Uses the parameter twice in one call."""
    w = _params[name]
    return (x * w).sin() + w * w


def nested(x, name, next_worker, next_name):
    """A -> B -> C: B multiplies by its parameter, C by its own, B again by its."""
    w = _params[name]
    z = rpc.rpc_sync(next_worker, mul_param, args=(x * w, next_name))
    return z * w


def gradient(context_id, name):
    """This worker's gradient of its parameter `name` in the context."""
    return rpc.autograd.get_gradients(context_id).get(_params[name])


def dot_grad(name):
    """The parameter's .grad (distributed autograd must leave it alone)."""
    return _params[name].grad


def live_contexts():
    return rpc.autograd._live_contexts()


def context_graph(context_id):
    """What this worker recorded in the context: ([names of each send
    function's next functions], number of receive functions, known workers)."""
    ctx = rpc.autograd._retrieve_context(context_id)
    sends = [[fn.name() for fn, _ in send.next_functions] for send in ctx._send_functions().values()]
    return sends, len(ctx._recv_functions()), ctx._known_worker_ids()


def cpu_seconds():
    """CPU time of this whole process (every thread) so far."""
    return time.process_time()


@torch.jit.script
def script_scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * w) + w


def scale_by_rref(rref, x):
    # On the owner, through a nested call: recorded only inside the context.
    return rpc.rpc_sync(rref.owner(), _times_local_value, args=(rref, x))


def _times_local_value(rref, x):
    return rref.local_value() * x


@torch.jit.script
def script_scale_by_rref(rref: rpc.RRef, x: torch.Tensor) -> torch.Tensor:
    scale = rref.to_here()
    assert isinstance(scale, torch.Tensor)
    return scale * x


class _FailInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("boom in the backward pass")


def fails_in_backward(x):
    return _FailInBackward.apply(x) * 2


class _DieInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        os._exit(3)


def dies_in_backward(x):
    return _DieInBackward.apply(x)


class _SlowInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


def slow_in_backward(x, seconds):
    return _SlowInBackward.apply(x, seconds)


class Part:
    """A small model part (a linear layer) owned by whichever worker makes it."""

    def __init__(self, seed):
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.randn(3, 3, generator=g, dtype=torch.float64).requires_grad_()
        self.bias = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()

    def forward(self, x):
        return torch.tanh(x @ self.weight + self.bias)

    def parameters(self):
        return [self.weight, self.bias]

    def param_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]

    def values(self):
        return [p.detach().clone() for p in self.parameters()]

    def weighted_sum(self, c):
        """Linear in the parameters: its gradient does not depend on them."""
        return (self.weight * c).sum() + self.bias.sum()


def hold_context_with_call(to):
    """Opens a distributed autograd context on a thread of this worker that
    keeps it open until the process dies, after one call to `to` in it (so
    `to` holds the context too). Returns its id."""
    opened = []
    ready = threading.Event()

    def hold():
        with rpc.autograd.context() as context_id:
            rpc.rpc_sync(to, torch.add, args=(torch.ones(1, requires_grad=True), 1))
            opened.append(context_id)
            ready.set()
            threading.Event().wait()

    threading.Thread(target=hold, daemon=True).start()
    assert ready.wait(10), "the call in the context did not complete"
    return opened[0]


class _Cube(torch.autograd.Function):
    """x ** 3 with its own backward, from a saved tensor; its backward raises
    while `fail` is set (SystemError: a class nothing else here raises)."""
    fail = False

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        if _Cube.fail:
            raise SystemError("the custom Function's backward failed on purpose")
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad


def cube_param(x, name):
    """A custom autograd Function on this worker, fed by the caller's x and this worker's parameter."""
    return _Cube.apply(x * _params[name])


def set_cube_fails(fail):
    _Cube.fail = fail


_hook_calls = []


def with_leaf_hooks(x, name):
    """x * w, with post hooks on w's AccumulateGrad node (one registered twice,
    as upstream's test_post_hooks does) that record what they get."""
    w = _params[name]
    y = x * w
    acc = y.grad_fn.next_functions[1][0]
    _hook_calls.clear()
    _hook_handles[:] = [acc.register_hook(lambda grad_inputs, grad_outputs, tag=tag: _hook_calls.append(
        (tag, len(grad_inputs), [g.clone() for g in grad_outputs]))) for tag in ("a", "b")]
    return y


_hook_handles = []


def leaf_hook_calls():
    """What the hooks of with_leaf_hooks saw; removes them."""
    for h in _hook_handles:
        h.remove()
    return list(_hook_calls)
