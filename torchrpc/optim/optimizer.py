"""DistributedOptimizer: one optimizer step over parameters that live on
several workers, with the gradients of a distributed autograd context.

The API of ``torch.distributed.optim.DistributedOptimizer``::

    opt = torchrpc.optim.DistributedOptimizer(torch.optim.SGD, param_rrefs, lr=0.05)
    with torchrpc.autograd.context() as context_id:
        loss = model(inputs)
        torchrpc.autograd.backward(context_id, [loss])
        opt.step(context_id)

Each owner of parameters gets one local optimizer for its parameters. For
SGD, Adam, AdamW, Adagrad and RMSprop it is a TorchScript functional
optimizer (:mod:`torchrpc.optim.functional`) that the owner steps from C++,
without the GIL (``torch.ops.torchrpc.optimizer_step``, sent as a builtin
call). Any other ``torch.optim`` class runs as itself, in Python, on the
owner. Steps on one worker run one at a time.
"""

import threading

import torch

from torchrpc import api, autograd, dispatch
from torchrpc._extension import native
from torchrpc.optim import functional


class _LocalOptimizer:
    """The optimizer of one owner's parameters; lives on that owner."""

    _lock = threading.Lock()  # Python steps on this worker, one at a time

    def __init__(self, optimizer_class, param_rrefs, args, kwargs):
        self._params = [rref.local_value() for rref in param_rrefs]
        self._functional_id = None
        self._optimizer = None
        scripted = functional.functional_optimizer(optimizer_class, self._params, *args, **kwargs)
        if scripted is not None:
            self._functional_id = native().optimizer_register(scripted, self._params)
        else:
            self._optimizer = optimizer_class(self._params, *args, **kwargs)

    def functional_id(self):
        return self._functional_id

    def step(self, context_id):
        grads = autograd.get_gradients(context_id)
        with _LocalOptimizer._lock:
            for p in self._params:
                p.grad = grads.get(p)
            self._optimizer.step()

    def __del__(self):
        if self._functional_id is not None:
            native().optimizer_unregister(self._functional_id)


def _step(local_rref, context_id):
    local_rref.local_value().step(context_id)


class DistributedOptimizer:
    """Steps ``optimizer_class`` over parameters owned by several workers.

    Args:
        optimizer_class: a ``torch.optim.Optimizer`` subclass.
        params_rref (list[RRef]): RRefs of the parameters (tensors that
            require grad), on any workers; the same parameter once.
        *args, **kwargs: the optimizer's other arguments (``lr=...``).

    The constructor makes the local optimizers and waits for them, so invalid
    arguments raise here, naming the owner.
    """

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError("DistributedOptimizer expects a torch.optim.Optimizer subclass, e.g. "
                            f"torch.optim.SGD; got {optimizer_class!r}")
        params_rref = list(params_rref)
        if not params_rref:
            raise ValueError("DistributedOptimizer got an empty list of parameter RRefs")
        by_owner = {}
        for rref in params_rref:
            by_owner.setdefault(rref.owner(), []).append(rref)
        self._locals = []
        for owner, rrefs in by_owner.items():
            local = api.remote(owner, _LocalOptimizer, args=(optimizer_class, rrefs, args, kwargs))
            self._locals.append((owner, local))
        # One round trip per owner, concurrently: a failed construction raises here.
        ids = [local.rpc_async().functional_id() for _, local in self._locals]
        self._functional_ids = [fut.wait() for fut in ids]

    def step(self, context_id):
        """Applies the gradients of `context_id` on every owner, concurrently;
        returns when all are done. Raises the first owner's error."""
        me = api.get_worker_info()
        calls = [(owner, *((torch.ops.torchrpc.optimizer_step, (fid, context_id)) if fid is not None
                           else (_step, (opt, context_id))))
                 for (owner, opt), fid in zip(self._locals, self._functional_ids)]
        # The other owners first, so that they step while this one does. Their
        # calls are waited for directly (Invocation.wait polls before it
        # sleeps), not through rpc_async's futures: a call that completes
        # during the local step would settle its future on the callback thread.
        remote = [dispatch.invoke("rpc_async", owner, fn, args) for owner, fn, args in calls if owner != me]
        failures = [_failure_of(fn, args) for owner, fn, args in calls if owner == me]  # no RPC to itself
        failures += [_failure_of(call.wait, ()) for call in remote]
        failure = next((f for f in failures if f is not None), None)
        if failure is not None:
            raise failure


def _failure_of(fn, args):
    """The exception fn(*args) raises, or None. (Caught in this frame, so the
    exception's traceback does not reference the caller's locals.)"""
    try:
        fn(*args)
    except Exception as exc:
        return exc
    return None
