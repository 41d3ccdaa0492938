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

import atexit
import contextlib
import functools
import numbers
import threading
import time
import warnings

import torch

from torchrpc import constants, errors, jit_ops, python_fallback, rendezvous, shipped_code
from torchrpc import rref as _rref
from torchrpc._extension import native
from torchrpc.options import RpcOptions, check_backend


class WorkerInfo:
    """A worker of the job: its unique ``name`` and its rank ``id``.

    Comparable (by id, then name), hashable and picklable.

    Attributes:
        id (int): the worker's rank.
        name (str): the worker's name.
    """

    __slots__ = ("id", "name")

    def __init__(self, name, id):
        self.name = name
        self.id = id

    def _key(self):
        return (self.id, self.name)

    def __eq__(self, other):
        return isinstance(other, WorkerInfo) and self._key() == other._key()

    def __lt__(self, other):
        if not isinstance(other, WorkerInfo):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self):
        return hash(self._key())

    def __reduce__(self):
        return (WorkerInfo, (self.name, self.id))

    def __repr__(self):
        return f"WorkerInfo(id={self.id}, name={self.name})"


class _State:
    """What init_rpc set up in this process."""

    def __init__(self, worker, me, workers, options):
        self.worker = worker  # the lifecycle (csrc/worker)
        self.agent = worker.agent
        self.rref_ctx = worker.rrefs  # the RRef protocol (csrc/rref)
        self.callbacks = native().CallbackRunner()  # runs rpc_async completions
        peer = worker.peers()[me.id]
        self.addresses = (peer[2], peer[3])  # (tcp, unix) this worker listens on
        self.closing = False  # shutdown() has begun
        self.me = me
        self.workers = workers  # by rank
        self.by_name = {w.name: w for w in workers}
        self.options = options


_state = None
_state_lock = threading.Lock()
_explicit_names = {}  # ScriptFunction -> name given to torchrpc.register


def _require_initialized(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _state is None:
            raise errors.NotInitializedError(
                "torchrpc is not initialized in this process; call "
                "torchrpc.init_rpc(name, rank=..., world_size=...) first."
            )
        return fn(*args, **kwargs)

    return wrapper


def init_rpc(name, backend=None, rank=-1, world_size=None, rpc_backend_options=None):
    """Joins this process to an RPC job as worker `name`.

    Blocks until every worker of the job has joined (up to
    ``RpcOptions.init_timeout``).

    Args:
        name (str): unique name of this worker: letters, digits, ``_`` and ``-``,
            fewer than 128 characters.
        backend (BackendType): ``None`` (default) or
            ``BackendType.TENSORPIPE`` (torchrpc's or ``torch.distributed.rpc``'s):
            torchrpc has one backend.
        rank (int): unique rank in ``[0, world_size)``; ``-1`` (default) reads
            ``RANK`` from the environment with ``env://``.
        world_size (int): number of workers; ``None`` reads ``WORLD_SIZE``.
        rpc_backend_options (RpcOptions): see :class:`RpcOptions`.

    Raises:
        TypeError, ValueError: on invalid arguments, a name used twice in the job,
            or an already initialized process.
    """
    global _state
    rendezvous.validate_name(name)
    check_backend(backend)
    options = RpcOptions.coerce(rpc_backend_options)
    if rank is not None and not isinstance(rank, numbers.Integral):
        raise TypeError(f"init_rpc(rank=...) expects an int; got {type(rank).__name__}")
    if world_size is not None and not isinstance(world_size, numbers.Integral):
        raise TypeError(f"init_rpc(world_size=...) expects an int; got {type(world_size).__name__}")
    C = native()
    with _state_lock:
        if _state is not None:
            raise RuntimeError(
                f"torchrpc is already initialized in this process as {_state.me.name!r}; "
                "call torchrpc.shutdown() before init_rpc() again."
            )
        store, rank, world_size = rendezvous.open_store(options, rank, world_size)
        worker = C.Worker(name, rank, world_size, options.num_worker_threads, options.rpc_timeout,
                          rendezvous.listen_host(options.init_method), rendezvous.host_id(), store,
                          _install_python)
        workers = [WorkerInfo(r[0], r[1]) for r in worker.peers()]
        _state = _State(worker, workers[rank], workers, options)


def _install_python(agent, rref_ctx):
    """The Python handlers of a worker, installed before it serves."""
    agent.set_python_handler(python_fallback.handle_call, python_fallback.handle_remote)
    agent.set_script_resolver(python_fallback.resolve_script)
    rref_ctx.install_python(python_fallback.encode_value, python_fallback.handle_method)
    for fn, explicit in _explicit_names.items():
        agent.register_script(explicit, fn)


def shutdown(graceful=True, timeout=constants.DEFAULT_SHUTDOWN_TIMEOUT_SEC):
    """Leaves the job and stops this worker's agent.

    Args:
        graceful (bool): if True (default), first wait until this worker's own
            calls have completed and every worker of the job has reached
            shutdown, serving their calls meanwhile. If False, stop at once;
            pending calls fail with ShutdownError.
        timeout (float): seconds the graceful wait may take (default 60); the
            agent then stops regardless and the error names what was missing.

    Raises:
        RpcTimeoutError: the graceful wait took longer than `timeout`.
    """
    global _state
    with _state_lock:
        state = _state
        if state is None or state.closing:
            return
        # The worker keeps serving until every worker got here, and what it
        # serves may use torchrpc (nested calls, RRefs): _state stays set.
        state.closing = True
    try:
        failure, leaked = state.worker.stop(graceful, timeout)
    finally:
        state.callbacks.stop(timeout)  # runs the completions of the calls shutdown failed
        native().reap_thread_states()  # the Python thread states of the threads that stopped
        python_fallback.forget_sent()
        shipped_code.forget()
        with _state_lock:
            _state = None
    if failure is not None:
        raise errors.from_native(failure)
    if leaked:
        warnings.warn(
            f"shutdown on {state.me.name}: {len(leaked)} owner RRef(s) still had users after every "
            f"worker released its RRefs (leaked): "
            + ", ".join(f"{rid} forks={forks}" for rid, forks, *_ in leaked[:10]),
            ResourceWarning,
            stacklevel=2,
        )


@atexit.register
def _shutdown_at_exit():
    # A process that forgot shutdown() still stops its threads before exiting.
    if _state is not None:
        shutdown(graceful=False)


@_require_initialized
def get_worker_info(worker_name=None):
    """Returns the WorkerInfo of `worker_name`, or of this worker if None.

    Raises:
        ValueError: no worker has that name.
    """
    if worker_name is None:
        return _state.me
    return _resolve(worker_name, "get_worker_info")


@_require_initialized
def get_rpc_timeout():
    """The default timeout of this worker's calls, in seconds
    (``RpcOptions.rpc_timeout``; 0 means no timeout)."""
    return _state.options.rpc_timeout


def is_available():
    """True: torchrpc always has RPC (``torch.distributed.rpc.is_available()``
    is False in torch builds without it)."""
    return True


def _all_worker_infos():
    return list(_state.workers)


def _resolve(to, call):
    state = _state
    if isinstance(to, WorkerInfo):
        if to.id < len(state.workers) and state.workers[to.id] == to:
            return to
        raise ValueError(f"{call}: {to} is not a worker of this job")
    if isinstance(to, str):
        info = state.by_name.get(to)
        if info is None:
            known = ", ".join(sorted(state.by_name))
            raise ValueError(f"{call}: unknown worker {to!r}; known workers: {known}")
        return info
    if isinstance(to, numbers.Integral) and not isinstance(to, bool):
        if 0 <= to < len(state.workers):
            return state.workers[to]
        raise ValueError(f"{call}: no worker has rank {to}; ranks are 0..{len(state.workers) - 1}")
    raise TypeError(
        f"{call}(to=...) expects a worker name (str), a rank (int) or a WorkerInfo; "
        f"got {type(to).__name__}"
    )


def _timeout(timeout, call):
    if timeout is None or timeout == constants.UNSET_RPC_TIMEOUT:
        return _state.options.rpc_timeout
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"{call}(timeout=...) expects seconds as a number; got {type(timeout).__name__}")
    if timeout < 0:
        raise ValueError(f"{call}(timeout={timeout}): use seconds >= 0 (0 means no timeout) or -1 for the default")
    return float(timeout)


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
    explicit = _explicit_names.get(func)
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
    state = _state
    if state is None:
        raise errors.NotInitializedError("torchrpc shut down while a call was being set up")
    return state.callbacks


def _identity(value):
    return value


def _invoke(call_kind, to, func, args, kwargs, timeout):
    """Classifies func once and sends the call; shared by every public call."""
    dst = _resolve(to, call_kind)
    seconds = _timeout(timeout, call_kind)
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


def _deliver(call_kind, dst, message, seconds, function, decode, resend=None):
    """Sends a call message (rpc_sync, rpc_async), or makes it a remote()."""
    if call_kind == "remote":
        return _rref.RRef._wrap(_state.rref_ctx.remote(dst.id, message, seconds, function))
    return _Invocation(_state.agent.send(dst.id, message, seconds, call_kind, function), decode, resend)


def _send(call_kind, dst, func, args, kwargs, seconds):
    C = native()
    args = tuple(args)
    if isinstance(func, str):  # a TorchScript function by the name the callee knows
        return _deliver(call_kind, dst, C.named_message(func, args, kwargs, call_kind), seconds, func, _identity)
    if isinstance(func, torch.jit.ScriptFunction):
        name, module = _script_name(func)
        return _script_call(call_kind, dst, func, name, module, args, kwargs, seconds)
    builtin = _builtin_name(func) if callable(func) else None
    if builtin is not None:
        message, schema_name = C.builtin_message(builtin, args, kwargs)
        return _deliver(call_kind, dst, message, seconds, schema_name, _identity)
    if not callable(func):
        raise TypeError(f"{call_kind}(func=...) expects a callable; got {type(func).__name__}")
    return _python_call(call_kind, dst, func, args, kwargs, seconds)


def _script_call(call_kind, dst, func, name, module, args, kwargs, seconds, ship_code=False):
    # A call is resent once with the function's code if the callee does not
    # have it (a plain function, like _python_call, so no cycle keeps the
    # arguments); remote() sends the name only.
    remote = call_kind == "remote"
    if remote:
        shipped = None
    else:
        shipped = shipped_code.with_code(func, dst.id) if ship_code else shipped_code.reference(func, dst.id)
    message = native().script_message(name, module, func, args, kwargs, shipped)
    resend = None if ship_code or remote else functools.partial(
        _script_call, call_kind, dst, func, name, module, args, kwargs, seconds, True)
    return _deliver(call_kind, dst, message, seconds, name, _identity, resend)


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
    # remote() always sends the whole function: the owner keeps no resend path.
    remote = call_kind == "remote"
    payload, tensors, name, forks = python_fallback.encode_call(func, dst.id, args, kwargs, force_full or remote,
                                                                request=not remote)
    resend = None if force_full or remote else functools.partial(
        _python_call, call_kind, dst, func, args, kwargs, seconds, True)
    with _forks_cancelled_on_error(forks):
        sent = _deliver(call_kind, dst, native().python_message(payload, tensors), seconds, name,
                        python_fallback.decode_result, resend)
    if forks and not remote:  # RRefs sent to their owner: released when it answers
        _state.rref_ctx.release_when_answered(sent.call, forks)
    return sent


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
    state = _state
    if state is None or rref._handle.is_owner():  # the owner's own proxy: a pickled call to itself
        return None
    seconds = _timeout(timeout, call_kind)
    call = state.rref_ctx.method_call(rref._handle, name, args, kwargs, seconds, call_kind)
    return None if call is None else _Invocation(call, python_fallback.decode_value)


@_require_initialized
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


@_require_initialized
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


@_require_initialized
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
    _explicit_names[fn] = name
    if _state is not None:
        _state.agent.register_script(name, fn)


def _debug_info():
    """Counters for tests and debugging: pending calls and open connections."""
    if _state is None:
        return {"initialized": False, "pending_requests": 0, "connections": 0}
    rrefs = _state.rref_ctx.snapshot()
    return {
        "initialized": True,
        "worker": _state.me.name,
        "pending_requests": _state.agent.pending_count(),
        "connections": _state.agent.connection_count(),
        "addresses": _state.addresses,
        "script_functions": sorted(_state.agent.script_names()),
        "owner_rrefs": len(rrefs["owner_objects"]),
        "user_rrefs": len(rrefs["users"]),
        "rref_messages_in_flight": rrefs["in_flight"],
    }
