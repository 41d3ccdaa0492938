"""Distributed autograd: backward passes that cross workers.

The API of ``torch.distributed.autograd``::

    import torchrpc

    with torchrpc.autograd.context() as context_id:
        t = torchrpc.rpc_sync("worker1", torch.add, args=(x, w))    # x, w require grad
        loss = (t * y).sum()
        torchrpc.autograd.backward(context_id, [loss])
        grads = torchrpc.autograd.get_gradients(context_id)          # {x: dx, w: dw, y: dy}

Inside a context, every call (``rpc_sync``, ``rpc_async``, ``remote``,
``RRef.to_here()``, and calls made by the callee while it runs the call)
records its tensors that require grad, in both directions. ``backward`` then
runs the backward pass on every worker that took part; gradients accumulate in
the context on each worker (``get_gradients``), never in ``.grad``. The work
runs in C++ (``csrc/autograd``): a TorchScript callee records and runs its part
of the backward pass without the GIL.

The backward pass is upstream's FAST mode: each worker runs its part of the
graph as gradients arrive for it, and the sum of the contributions is what
accumulates.
"""

import numbers

import torch

from torchrpc import errors, jit_ops, state
from torchrpc._extension import native


def _agent(what):
    return state.require(what).agent


def _check_context_id(context_id, what):
    # "incompatible function arguments": the phrase of torch's binding, which code matches on.
    if isinstance(context_id, bool) or not isinstance(context_id, numbers.Integral):
        raise TypeError(f"{what}(): incompatible function arguments: it expects an int context_id "
                        f"(from `with torchrpc.autograd.context() as context_id`); "
                        f"got {type(context_id).__name__}")


class context:
    """A distributed autograd context: ``with torchrpc.autograd.context() as context_id:``.

    The id is unique in the job. Calls made on this thread inside the block
    are recorded in it. When the block exits, the context is released here
    and on every worker that took part (without waiting for them).
    """

    def __enter__(self):
        agent = _agent("torchrpc.autograd.context()")
        self._agent = agent
        self.autograd_context_id = native().autograd_new_context()
        return self.autograd_context_id

    def __exit__(self, exc_type, exc, tb):
        native().autograd_release_context(self._agent, self.autograd_context_id)
        return False


def backward(context_id, roots, retain_graph=False):
    """Runs the distributed backward pass from `roots`, in context `context_id`.

    Returns when every worker that took part is done. Gradients accumulate in
    the context (see :func:`get_gradients`), never in ``.grad``.

    Args:
        context_id (int): the id that ``with torchrpc.autograd.context()`` gave.
        roots (list[Tensor]): tensors of one element each (e.g. losses) on this worker.
        retain_graph (bool): keep the graph, so that ``backward`` may run again.

    Raises:
        TypeError: `context_id` is not an int or `roots` not a list of tensors.
        RuntimeError: an unknown context, or an invalid root (none, one that
            does not require grad, is not a scalar or is a leaf), as
            ``torch.distributed.autograd.backward`` raises.
        RuntimeError: the backward pass failed on a worker; the message says
            "Error on Node <rank>: " and names the worker.
        torchrpc.errors.PeerUnreachableError: a worker of the pass died.
    """
    _check_context_id(context_id, "torchrpc.autograd.backward")
    if not isinstance(roots, (list, tuple)) or not all(isinstance(r, torch.Tensor) for r in roots):
        raise TypeError("torchrpc.autograd.backward(): incompatible function arguments: it expects "
                        "roots as a list of tensors, e.g. backward(context_id, [loss]); "
                        f"got {type(roots).__name__}")
    if torch.autograd._profiler_enabled():  # the whole pass as one range, named as upstream's
        with torch.autograd.profiler.record_function("torch::distributed::autograd::backward"):
            return _backward(context_id, roots, retain_graph)
    return _backward(context_id, roots, retain_graph)


def _backward(context_id, roots, retain_graph):
    call = native().autograd_backward(_agent("torchrpc.autograd.backward"), context_id, list(roots),
                                      bool(retain_graph))
    ok, value = call.result()
    if not ok:
        raise errors.from_native(value)


def get_gradients(context_id):
    """The gradients accumulated on this worker in context `context_id`:
    a dict from each tensor that requires grad (a leaf of the graph) to its gradient."""
    _check_context_id(context_id, "torchrpc.autograd.get_gradients")
    return dict(native().autograd_gradients(_agent("torchrpc.autograd.get_gradients"), context_id))


def is_available():
    """True: torchrpc always has distributed autograd (as
    ``torch.distributed.autograd.is_available()`` is in torch builds with it)."""
    return True


def _current_context_id():
    """The id of this thread's context, or -1 outside one."""
    return native().autograd_current_context()


class DistAutogradContext:
    """What one worker recorded in a distributed autograd context, as
    ``torch.distributed.autograd``'s private context objects show it (a
    snapshot taken when it is retrieved)."""

    def __init__(self, context_id, sends, recvs, workers):
        self._id, self._sends, self._recvs, self._workers = context_id, sends, recvs, workers

    def _context_id(self):
        return self._id

    def _send_functions(self):
        """{id: node}: the send functions (``SendRpcBackward``), in the order they were recorded."""
        return dict(self._sends)

    def _recv_functions(self):
        """{id: node}: the receive functions (``RecvRpcBackward``), in the order they were recorded."""
        return dict(self._recvs)

    def _known_worker_ids(self):
        """Ranks of the workers this worker sent requests to in the context."""
        return set(self._workers)

    def __repr__(self):
        return (f"DistAutogradContext(id={self._id}, sends={len(self._sends)}, recvs={len(self._recvs)}, "
                f"workers={sorted(self._workers)})")


def _retrieve_context(context_id):
    """The context `context_id` as this worker holds it.

    Raises:
        RuntimeError: no such context here ("Could not find autograd context with id: ...").
    """
    _check_context_id(context_id, "torchrpc.autograd._retrieve_context")
    sends, recvs, workers = native().autograd_context_graph(_agent("torchrpc.autograd._retrieve_context"),
                                                            context_id)
    return DistAutogradContext(context_id, sends, recvs, workers)


def _current_context():
    """This thread's context (see :func:`_retrieve_context`).

    Raises:
        RuntimeError: the thread is not inside ``with torchrpc.autograd.context()``.
    """
    context_id = _current_context_id()
    if context_id == -1:
        raise RuntimeError("this thread has no distributed autograd context (Current thread doesn't have a "
                           "valid autograd context): call this inside `with torchrpc.autograd.context()`")
    return _retrieve_context(context_id)


def _live_contexts():
    """Ids of the contexts this worker still holds (for tests and debugging)."""
    return sorted(native().autograd_live_contexts())


# Inside TorchScript, backward and get_gradients compile to torchrpc's ops.
jit_ops.bind(backward, jit_ops.dist_backward)
jit_ops.bind(get_gradients, jit_ops.get_gradients)
