"""The RPC API: init_rpc, shutdown, rpc_sync, rpc_async, remote, get_worker_info.

Every process of a job calls :func:`init_rpc` with a unique name and rank;
then any worker can call functions on any other::

    import torch
    import torchrpc as rpc

    @torch.jit.script
    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    rpc.init_rpc("worker0", rank=0, world_size=2,
                 rpc_backend_options=rpc.RpcOptions(init_method="tcp://127.0.0.1:29500"))
    rpc.rpc_sync("worker1", add, args=(torch.ones(2), torch.ones(2)))  # TorchScript: no GIL
    rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1))       # builtin op: no GIL
    rpc.rpc_sync("worker1", sorted, args=([3, 1, 2],))                 # Python: cloudpickle
    rpc.shutdown()

A callee is classified once on the caller: a builtin operator runs through
the dispatcher, a ``torch.jit.ScriptFunction`` runs in the callee's C++ thread
pool without the GIL, and anything else is pickled with cloudpickle and run
under the callee's GIL.
"""
import contextlib
import functools

import torch

from torchrpc import constants, errors, jit_ops, python_fallback, shipped_code, state
from torchrpc import rref as _rref
from torchrpc.lifecycle import init_rpc, shutdown
from torchrpc.state import WorkerInfo, require_initialized

__all__ = [
    "WorkerInfo",
    "get_rpc_timeout",
    "get_worker_info",
    "init_rpc",
    "is_available",
    "register",
    "remote",
    "rpc_async",
    "rpc_sync",
    "shutdown",
]


@require_initialized
def get_worker_info(worker_name=None):
    """Returns the WorkerInfo of `worker_name`, or of this worker if None.

    Raises:
        ValueError: no worker has that name.
    """
    session = state.require()
    if worker_name is None:
        return session.me
    return session.resolve(worker_name, "get_worker_info")


@require_initialized
def get_rpc_timeout():
    """The default timeout of this worker's calls, in seconds
    (``RpcOptions.rpc_timeout``; 0 means no timeout)."""
    return state.require().options.rpc_timeout


def is_available():
    """True: torchrpc always has RPC (``torch.distributed.rpc.is_available()``
    is False in torch builds without it)."""
    return True


def _builtin_name(func):
    """'aten::add' for torch.add, torch.Tensor.add, torch.ops.aten.add; else None."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        return func._qualified_op_name
    if isinstance(func, torch._ops.OpOverload):
        return func._schema.name
    if getattr(func, "__objclass__", None) is torch._C.TensorBase:
        return "aten::" + func.__name__
    try:
        return torch.jit._builtins._find_builtin(func)
    except TypeError:  # unhashable callables
        return None


def _script_name(func):
    explicit = state.script_name(func)
    if explicit is not None:
        return explicit, ""
    return python_fallback.script_reference(func)


class _Invocation:
    """One call in flight: the native Call, how to decode its value, and how
    to resend it with the function itself when the callee does not know it
    (a Python function it has not cached, a TorchScript function it lacks)."""

    __slots__ = ("call", "decode", "resend", "_pending")

    def __init__(self, call, decode, resend=None):
        self.call = call
        self.decode = decode
        self.resend = resend
        self._pending = None  # see _complete()

    def _outcome(self):
        ok, value = self.call.result()
        if not ok and self.resend is not None and value[2] == errors.UnknownFunctionError.REMOTE_TYPE:
            return None, self.resend()
        if not ok:
            raise errors.from_native(value)
        return self.decode(value), None

    def wait(self):
        value, again = self._outcome()
        return again.wait() if again is not None else value

    def future(self):
        fut = _Future()
        fut._invocation = self
        self._complete(fut)
        return fut

    def _complete(self, fut):
        # The callback thread runs `done` unless a waiting thread claimed the
        # call first (Call.claim_and_wait); a `done` that will not run may sit
        # in its queue a while, so settle() empties `pending` and it holds
        # nothing (no arguments, no future).
        pending = self._pending = [self, fut]

        def done():
            if pending:
                invocation, future = pending
                invocation.settle(future)

        self.call.add_done_callback(_callbacks(), done)

    def settle(self, fut):
        """Completes fut with this call's outcome, or hands it to the resent call."""
        if self._pending is not None:
            self._pending.clear()
            self._pending = None
        try:
            value, again = self._outcome()
        except BaseException as exc:
            fut._invocation = None
            # Without this frame's traceback: it references `fut`, which
            # holds exc in C++ where gc cannot see the cycle, and it would
            # keep the call's arguments (RRefs too) alive forever.
            fut.set_exception(exc.with_traceback(None))
            return
        if again is not None:
            fut._invocation = again
            again._complete(fut)
        else:
            fut._invocation = None
            fut.set_result(value)


class _Future(torch.futures.Future):
    """rpc_async's future. A thread that waits for it settles it itself, if
    it claims the call before the call completes; otherwise the torchrpc
    callback thread does. A waiter then needs no hand-over from that thread
    (a wake-up and the GIL): rpc_async(...).wait() cost 2-3x an rpc_sync
    before. Once a callback has been added, only the callback thread settles
    it, so callbacks keep running there."""

    _invocation = None  # the call that settles it; None once settled
    _callbacks_added = False

    def wait(self):
        inv = self._invocation
        while inv is not None and not self._callbacks_added and not self.done():
            if not inv.call.claim_and_wait():  # polls, then sleeps; without the GIL
                break  # the call completed first: the callback thread settles it
            inv.settle(self)
            inv = self._invocation  # the resent call, or None
        return super().wait()

    def then(self, callback):
        self._callbacks_added = True
        return super().then(callback)

    def add_done_callback(self, callback):
        self._callbacks_added = True
        super().add_done_callback(callback)


def _callbacks():
    return state.callbacks()


def _identity(value):
    return value


def _invoke(call_kind, to, func, args, kwargs, timeout):
    """Classifies func once and sends the call; shared by every public call."""
    session = state.require()
    dst = session.resolve(to, call_kind)
    seconds = session.timeout(timeout, call_kind)
    if args is None:
        args = ()
    elif not isinstance(args, (tuple, list)):
        raise TypeError(f"{call_kind}(args=...) expects a tuple; got {type(args).__name__}")
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, dict):
        raise TypeError(f"{call_kind}(kwargs=...) expects a dict; got {type(kwargs).__name__}")
    try:
        return _send(call_kind, dst, func, args, kwargs, seconds)
    except (TypeError, RuntimeError) as err:
        # TorchScript and builtin callees take an RRef as its TorchScript object
        # (torch.classes.torchrpc.RRef): converted here, after the first attempt
        # failed on it (nothing was sent), so calls without RRefs pay nothing.
        if not (isinstance(func, (str, torch.jit.ScriptFunction)) or _builtin_name(func) is not None):
            raise
        converted = _rref._to_script_values((args, kwargs))
        if converted is None:
            raise
        args, kwargs = converted
        try:
            return _send(call_kind, dst, func, args, kwargs, seconds)
        except (TypeError, RuntimeError) as again:
            raise again from err


def _send(call_kind, dst, func, args, kwargs, seconds):
    session = state.require()
    agent = session.agent
    remote = call_kind == "remote"
    if isinstance(func, str):  # a TorchScript function by the name the callee knows
        if remote:
            return _rref.RRef._wrap(session.rref_ctx.remote_named(dst.id, func, tuple(args), kwargs, seconds))
        call = agent.named_call(dst.name, func, tuple(args), kwargs, seconds, call_kind)
        return _Invocation(call, _identity)
    if isinstance(func, torch.jit.ScriptFunction):
        name, module = _script_name(func)
        if remote:
            return _rref.RRef._wrap(
                session.rref_ctx.remote_script(dst.id, name, module, func, tuple(args), kwargs, seconds))
        return _script_call(call_kind, dst, func, name, module, args, kwargs, seconds)
    builtin = _builtin_name(func) if callable(func) else None
    if builtin is not None:
        if remote:
            return _rref.RRef._wrap(
                session.rref_ctx.remote_builtin(dst.id, builtin, tuple(args), kwargs, seconds))
        call = agent.builtin_call(dst.id, builtin, tuple(args), kwargs, seconds, call_kind)
        return _Invocation(call, _identity)
    if not callable(func):
        raise TypeError(f"{call_kind}(func=...) expects a callable; got {type(func).__name__}")
    if remote:
        # Always the whole function: the owner keeps no resend path for remote().
        payload, tensors, name, forks = python_fallback.encode_call(func, dst.id, args, kwargs, force_full=True,
                                                                    request=False)
        with _forks_cancelled_on_error(forks):
            return _rref.RRef._wrap(session.rref_ctx.remote_python(dst.id, payload, tensors, seconds, name))

    return _python_call(call_kind, dst, func, args, kwargs, seconds)


def _script_call(call_kind, dst, func, name, module, args, kwargs, seconds, ship_code=False):
    # Resent once with the function's code if the callee does not have it
    # (a plain function, like _python_call, so no cycle keeps the arguments).
    shipped = shipped_code.with_code(func, dst.id) if ship_code else shipped_code.reference(func, dst.id)
    call = state.require().agent.script_call(dst.id, name, module, func, tuple(args), kwargs, seconds, call_kind, shipped)
    resend = None if ship_code else functools.partial(
        _script_call, call_kind, dst, func, name, module, args, kwargs, seconds, True)
    return _Invocation(call, _identity, resend)


@contextlib.contextmanager
def _forks_cancelled_on_error(forks):
    """A message that could not be sent (e.g. a sparse tensor the wire refuses)
    carried no RRef: its forks are undone, so nothing holds those RRefs."""
    try:
        yield
    except BaseException:
        python_fallback.cancel_forks(forks)
        raise


def _python_call(call_kind, dst, func, args, kwargs, seconds, force_full=False):
    # A plain function, not a closure that refers to itself: such a cycle would
    # keep the arguments (tensors, RRefs) alive until the garbage collector ran.
    payload, tensors, name, forks = python_fallback.encode_call(func, dst.id, args, kwargs, force_full)
    session = state.require()
    with _forks_cancelled_on_error(forks):
        call = session.agent.python_call(dst.id, payload, tensors, seconds, call_kind, name)
    if forks:  # RRefs sent to their owner: released when it answers
        session.rref_ctx.release_when_answered(call, forks)
    resend = None if force_full else functools.partial(
        _python_call, call_kind, dst, func, args, kwargs, seconds, True)
    return _Invocation(call, python_fallback.decode_result, resend)


def _method_call(call_kind, rref, name, args, kwargs, timeout):
    """A proxy's call rref.<call_kind>().name(*args, **kwargs) as an
    RREF_METHOD_CALL: the arguments travel as IValues and the owner calls the
    method on its value, with no pickle and no fork of the RRef. In the
    distributed RNN tutorial's training loop a proxy call took 280-330 us
    pickled and 190-220 us so (the iteration 1.44-1.45x -> 1.34-1.35x its
    local twin); back to back 51 -> 39 us for a method taking an int.
    None when an argument is not plain (python_fallback::plainIValue), the
    RRef is the owner's own, or torchrpc is not running: the caller then
    sends the pickled call."""
    session = state.current()
    if session is None or rref._handle.is_owner():  # the owner's own proxy: a pickled call to itself
        return None
    seconds = session.timeout(timeout, call_kind)
    call = session.rref_ctx.method_call(rref._handle, name, args, kwargs, seconds, call_kind)
    return None if call is None else _Invocation(call, python_fallback.decode_value)


@require_initialized
def rpc_sync(to, func, args=None, kwargs=None, timeout=constants.UNSET_RPC_TIMEOUT):
    """Runs ``func(*args, **kwargs)`` on worker `to` and returns its result.

    Thread-safe. Argument tensors must not be modified until the call returns.

    Args:
        to (str or int or WorkerInfo): the callee: name, rank or WorkerInfo.
        func (callable or str): a ``@torch.jit.script`` function (runs without
            the GIL), a builtin operator such as ``torch.add`` (runs without the
            GIL), any picklable Python callable (runs under the callee's GIL),
            or the name of a TorchScript function the callee knows (given to
            :func:`register` there, or its qualified name). Calls by name work
            the same inside ``@torch.jit.script`` code.
        args (tuple): positional arguments (default none).
        kwargs (dict): keyword arguments (default none).
        timeout (float): seconds before RpcTimeoutError; ``0`` means no timeout,
            ``-1`` (default) uses ``RpcOptions.rpc_timeout``.

    Returns:
        The value func returned on the callee.

    Raises:
        RpcTimeoutError: no response within `timeout`.
        PeerUnreachableError: the callee exited or its connection closed.
        Exception: what func raised on the callee, re-raised with its type when
            importable (otherwise RemoteError), the callee's traceback attached.
        TypeError, ValueError: bad arguments, unknown worker, unpicklable func.

    Example::

        >>> torchrpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 3))
        tensor([4., 4.])
    """
    return _invoke("rpc_sync", to, func, args, kwargs, timeout).wait()


@require_initialized
def rpc_async(to, func, args=None, kwargs=None, timeout=constants.UNSET_RPC_TIMEOUT):
    """Like :func:`rpc_sync`, but returns at once with a ``torch.futures.Future``.

    The future's ``wait()`` returns the result or raises the error that
    rpc_sync would raise; ``then``, ``done``, ``value``,
    ``torch.futures.collect_all`` and ``wait_all`` work as usual. Callbacks
    added before the call completes run in order on one torchrpc thread
    (never on the I/O thread): keep them short, and do not wait in them for
    another call's future. A ``wait()`` on a future without callbacks
    completes it in the waiting thread, as fast as :func:`rpc_sync`.

    Example::

        >>> fut = torchrpc.rpc_async("worker1", torch.add, args=(torch.ones(2), 3))
        >>> fut.wait()
        tensor([4., 4.])
    """
    return _invoke("rpc_async", to, func, args, kwargs, timeout).future()


@require_initialized
def remote(to, func, args=None, kwargs=None, timeout=constants.UNSET_RPC_TIMEOUT):
    """Runs ``func(*args, **kwargs)`` on worker `to`, which keeps the result;
    returns an :class:`RRef` to it at once.

    The owner `to` creates the value asynchronously: a ``@torch.jit.script``
    function or builtin runs in its C++ thread pool without the GIL; any other
    callable (a class too: the RRef then references a remote object) runs
    under its GIL. Use ``rref.to_here()`` to copy the value, or
    ``rref.rpc_sync().method(...)`` to call methods of it on the owner.

    Inside ``@torch.jit.script`` code, the same call (with `func` the name
    of a TorchScript function the owner knows, as for :func:`rpc_sync`)
    returns the TorchScript RRef, ``torch.classes.torchrpc.RRef``: annotate
    it as ``torchrpc.RRef``; its ``to_here()`` / ``local_value()`` return
    ``Any`` (refine with ``isinstance``).

    Args:
        to (str or int or WorkerInfo): the owner of the new value.
        func (callable or str): what creates the value (see :func:`rpc_sync`),
            or the name of a TorchScript function the owner knows.
        args (tuple): positional arguments (default none).
        kwargs (dict): keyword arguments (default none).
        timeout (float): seconds for creating the value; ``0`` means no
            timeout, ``-1`` (default) uses ``RpcOptions.rpc_timeout``. If it
            passes, ``to_here()`` raises RpcTimeoutError.

    Returns:
        RRef: owned by `to` (an owner RRef if `to` is this worker).

    Raises:
        TypeError, ValueError: bad arguments, unknown worker, unpicklable func.
        An error raised while creating the value is raised by ``to_here()``
        and by the proxies, with the owner's name and traceback.

    Example::

        >>> rref = torchrpc.remote("worker1", torch.add, args=(torch.ones(2), 3))
        >>> rref.to_here()
        tensor([4., 4.])
    """
    return _invoke("remote", to, func, args, kwargs, timeout)

jit_ops.bind(rpc_sync, jit_ops.rpc_sync)
jit_ops.bind(rpc_async, jit_ops.rpc_async)
jit_ops.bind(remote, jit_ops.remote)


def register(name, fn):
    """Registers a TorchScript function, or a scripted module, under a name.

    Callers may then call it by that name (``rpc_sync(to, "name", ...)``,
    also from inside TorchScript). Callers that registered the same function
    send the name instead of its qualified name (which TorchScript may mangle
    when a function is redefined). A scripted module is served by its
    ``forward``, without the GIL. Call it on every worker that serves (or
    sends) the name, before or after init_rpc.

    Args:
        name (str): the name callers use.
        fn (torch.jit.ScriptFunction or torch.jit.ScriptModule): what runs.

    Example::

        >>> @torch.jit.script
        ... def double(x: torch.Tensor) -> torch.Tensor:
        ...     return x * 2
        >>> torchrpc.register("double", double)
        >>> torchrpc.register("model", torch.jit.script(MyModel()))
    """
    if not isinstance(fn, (torch.jit.ScriptFunction, torch.jit.ScriptModule)):
        raise TypeError(
            "torchrpc.register(name, fn) expects a @torch.jit.script function or a scripted "
            f"module (torch.jit.script(module)); got {type(fn).__name__}"
        )
    if not isinstance(name, str) or not name:
        raise TypeError("torchrpc.register(name, fn) expects a non-empty str name")
    state.register_script(name, fn)


def _debug_info():
    """Counters for tests and debugging: pending calls and open connections."""
    session = state.current()
    if session is None:
        return {"initialized": False, "pending_requests": 0, "connections": 0}
    rrefs = session.rref_ctx.snapshot()
    return {
        "initialized": True,
        "worker": session.me.name,
        "pending_requests": session.agent.pending_count(),
        "connections": session.agent.connection_count(),
        "addresses": session.addresses,
        "script_functions": sorted(session.agent.script_names()),
        "owner_rrefs": len(rrefs["owner_objects"]),
        "user_rrefs": len(rrefs["users"]),
        "rref_messages_in_flight": rrefs["in_flight"],
    }
