"""``torchrpc.functions.async_execution``: callees that return a Future.

A function decorated with :func:`async_execution` returns a
``torch.futures.Future`` instead of its result; the callee sends the
response when that future completes, and the thread that ran the function is
free meanwhile. Use it for functions that wait for other calls or for a batch
to fill up::

    @torchrpc.functions.async_execution
    def add_then_scale(to, x, y, z):
        return torchrpc.rpc_async(to, torch.add, args=(x, y)).then(
            lambda fut: fut.wait() * z)

    torchrpc.rpc_sync("worker1", add_then_scale, args=("worker2", x, y, 3))

- With ``@staticmethod`` / ``@classmethod``, put ``@async_execution`` innermost
  (closest to the function). Bound methods keep the mark.
- A ``@torch.jit.script`` function that returns ``Future[T]`` is asynchronous
  by its type: the callee chains its future without the GIL, with or without
  this decorator (put the decorator outermost if you use it). A decorated
  script function that returns anything else fails when it is called.
"""

import functools

import torch

from torchrpc import state

_MARK = "_torchrpc_async_execution"


def async_execution(fn):
    """Marks `fn` as returning a ``torch.futures.Future`` of its result."""
    if isinstance(fn, torch.jit.ScriptFunction):
        # The callee chains its Future in C++; one that returns anything else
        # fails when called (as upstream), so a module that never calls it imports.
        setattr(fn, _MARK, True)
        state.callees_changed()
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


def is_async_execution(fn):
    return getattr(fn, _MARK, False)


class Deferred:
    """What a helper that runs a user's function on the callee returns when
    that function is @async_execution (e.g. a method called through an RRef
    proxy): the callee answers with the future's value, once it completes."""

    __slots__ = ("future",)

    def __init__(self, future):
        self.future = future
