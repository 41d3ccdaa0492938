"""Remote references: :class:`RRef` and the proxies behind ``rref.rpc_sync()``.

An RRef names a value that lives on one worker, its *owner*. The owner holds
the value; every other worker holding the RRef holds a *user* RRef, which is
only ids. :func:`torchrpc.remote` returns an RRef at once while the owner
creates the value; ``to_here()`` copies the value to the caller.

RRefs can be passed as arguments and results of any call, Python,
TorchScript or builtin (also nested, and back to the owner, where they become
the owner's RRef). The owner keeps the value alive while any worker holds an
RRef to it and frees it when the last one is gone (upstream's Remote
Reference Protocol, implemented in ``csrc/rref/``).

Inside TorchScript an RRef is the custom class ``torch.classes.torchrpc.RRef``
(``jit_ops/script_rref.h``), a handle on the same C++ RRef: annotate it as
``torchrpc.RRef`` (or ``torchrpc.RRef[T]``, as upstream; ``T`` is not checked);
it has ``to_here(timeout=-1.)``, ``local_value()``, ``owner_name()`` and
``is_owner()``, whose values are ``Any``. ``torchrpc.remote(to, "name",
args=...)`` in scripted code creates one. Python RRefs passed to TorchScript
or builtin callees through torchrpc are converted; RRefs that come back from
them are ``torchrpc.RRef``. When calling a scripted function directly (no RPC),
pass ``rref.to_script()``, and wrap what it returns with
:meth:`RRef.from_script`.

Example::

    >>> rref = torchrpc.remote("worker1", torch.add, args=(torch.ones(2), 1))
    >>> rref.to_here()
    tensor([2., 2.])
    >>> counter = torchrpc.remote("worker1", Counter, args=(0,))   # a remote object
    >>> counter.rpc_sync().bump(5)                                 # a method call on worker1
    5
"""

import torch

from torchrpc import autograd, constants, dispatch, errors, functions, python_fallback, state
from torchrpc._extension import native
from torchrpc.invocation import Invocation


class RRef:
    """A reference to a value owned by one worker.

    ``RRef(value)`` makes this worker the owner of `value`. RRefs made by
    :func:`torchrpc.remote` or received in a call are user RRefs unless this
    worker owns the value.

    Thread-safe: one RRef may be used from several threads.

    Args:
        value: any Python object (kept by reference, not copied).
        type_hint: accepted for compatibility with ``torch.distributed.rpc`` and ignored.

    .. warning::
        An RRef is valid only while the torchrpc session that made it runs;
        after ``shutdown()`` its methods raise.
    """

    __slots__ = ("_handle", "_type", "__weakref__")

    def __init__(self, value, type_hint=None):
        self._handle = state.require("RRef(value)").rref_ctx.create_owner(value)

    @classmethod
    def _wrap(cls, handle):
        rref = cls.__new__(cls)
        rref._handle = handle
        return rref

    def __class_getitem__(cls, item):
        # RRef[T] as in torch.distributed.rpc: an annotation (T is not checked).
        return cls

    # ---- TorchScript --------------------------------------------------------

    def to_script(self):
        """This RRef as its TorchScript object (``torch.classes.torchrpc.RRef``),
        for calling a scripted function directly; torchrpc calls convert RRef
        arguments by themselves. Both share one reference (no protocol message)."""
        return self._handle.script_object()

    @classmethod
    def from_script(cls, obj):
        """The RRef of a TorchScript RRef object (what a scripted function called
        directly returns).

        Raises:
            TypeError: `obj` is not a TorchScript RRef.
        """
        if isinstance(obj, cls):
            return obj
        rref = _from_script_object(obj)
        if rref is None:
            raise TypeError(
                f"RRef.from_script() expects a torch.classes.torchrpc.RRef object; got {type(obj).__name__}"
            )
        return rref

    # ---- identity -----------------------------------------------------------

    def is_owner(self):
        """Whether this worker owns the value."""
        return self._handle.is_owner()

    def owner(self):
        """The owner's :class:`WorkerInfo`."""
        session = state.require("RRef.owner()")
        owner = self._handle.owner()
        info = session.worker_at(owner)
        if info is None:  # the owner left a dynamic job: "<name> (rank N) left ..."
            why = session.agent.departed(owner) or f"rank{owner}"
            info = state.WorkerInfo(why.split(" (rank ")[0], owner)
        return info

    def owner_name(self):
        """The owner's worker name."""
        return self.owner().name

    def confirmed_by_owner(self):
        """Whether the owner knows about this RRef (always True on the owner): once
        it answered remote(), or the fork request of an RRef from another user (a
        call that receives one runs only then, as upstream's). Until then this
        worker keeps it alive, so the owner cannot free the value early."""
        return self._handle.confirmed()

    def _get_profiling_future(self):
        """A future that completes once remote()'s call is answered, and with
        it recorded in the caller's profiler (upstream's name); completed at
        once for an RRef that no remote() of this worker is creating."""
        call = self._handle.profiled_creation()
        if call is None:
            future = torch.futures.Future()
            future.set_result(None)
            return future
        # Settled as rpc_async's futures are: its callbacks run on the
        # callback thread, never on the I/O thread that answers the call.
        return Invocation(call, _no_value).future()

    # ---- values -------------------------------------------------------------

    def local_value(self):
        """The value itself (owner only; no copy).

        Waits until remote() has created it (up to the default RPC timeout).

        Raises:
            RuntimeError: called on a user RRef (use ``to_here()``).
            Exception: creating the value raised; re-raised with the owner's
                name and traceback.
        """
        if not self._handle.is_owner():
            session = state.require("RRef.local_value()")
            raise RuntimeError(
                f"For UserRRef(rref_id={_global_id(self._handle.id())}, fork_id="
                f"{_global_id(self._handle.fork_id())}), can't call localValue() on user {session.me}. "
                f"Call it on owner {self.owner()}: local_value() can only be called on the owner of an RRef; "
                "use to_here() to copy the value here."
            )
        return self._owner_value(state.require("RRef.local_value()").options.rpc_timeout)

    def _owner_value(self, seconds):
        ok, value = self._handle.local_value(seconds)
        if not ok:
            raise errors.from_native(value)
        return value

    def to_here(self, timeout=constants.UNSET_RPC_TIMEOUT):
        """Copies the value to this worker (on the owner: returns the value).

        Args:
            timeout (float): seconds; ``0`` means no timeout, ``-1`` (default)
                uses ``RpcOptions.rpc_timeout``.

        Raises:
            RpcTimeoutError: no value within `timeout`.
            PeerUnreachableError: the owner exited (the message names it).
            Exception: creating the value raised on the owner; re-raised with
                its type, a message naming the owner, and the owner's traceback.
        """
        if self._handle.deleted():  # e.g. released by a graceful shutdown
            raise RuntimeError(f"{self} was released (by shutdown(), or when its owner left): Cannot call "
                               "to_here() on it after deletion.")
        session = state.require("RRef.to_here()")
        seconds = session.timeout(timeout, "to_here")
        if self._handle.is_owner():
            return self._owner_value(seconds)
        failure = self._handle.creation_error()
        if failure is not None:
            kind, message, remote_type, tb = failure
            raise errors.from_native((kind, f"remote() of RRef {self._handle.id()} on "
                                      f"{self.owner_name()} failed: {message}", remote_type, tb))
        ok, value = session.rref_ctx.fetch(self._handle, seconds).result()
        if not ok:
            raise errors.from_native(value)
        return python_fallback.decode_value(value)

    def _get_type(self, timeout=constants.UNSET_RPC_TIMEOUT, blocking=True):
        """The type of the value, asked of the owner once: later calls return
        it (``blocking=False``: the same Future) without a call, as upstream.
        An error creating the value is raised (or fails that Future) as is."""
        fut = getattr(self, "_type", None)
        if fut is None:
            if self._handle.is_owner():
                fut = _done(type(self.local_value()))
            else:
                # rpc_async either way, as upstream (its profiler shows rpc_async#_rref_typeof_on_owner).
                call = dispatch.invoke("rpc_async", self.owner(), _rref_typeof_on_owner, (self,), None, timeout)
                fut = _done(call.wait()) if blocking else call.future()
            self._type = fut
        return fut.wait() if blocking else fut

    def _get_future(self):
        """A Future that completes once the owner answered remote() (the
        value, or the error creating it, is then there for to_here()), or
        fails if remote() failed (owner unreachable, timeout); done at once
        for other RRefs. For profiling and tests, as upstream."""
        return Invocation(self._handle.creation(), _no_value).future()

    # ---- proxies ------------------------------------------------------------

    def rpc_sync(self, timeout=constants.UNSET_RPC_TIMEOUT):
        """A proxy whose method calls run on the owner: ``rref.rpc_sync().f(x)``
        is ``rpc_sync(owner, lambda: rref.local_value().f(x))``.

        When every argument is a plain value (tensors, numbers, strings,
        None, and tuples, lists and dicts of them), the call is not pickled:
        it travels as TorchScript values and the owner calls the method
        directly; a plain result comes back the same way. Anything else
        (RRefs, other objects, a tensor that requires grad outside a
        distributed autograd context) is pickled as for any Python call.
        Both give the same result."""
        return _Proxy(self, "rpc_sync", timeout)

    def rpc_async(self, timeout=constants.UNSET_RPC_TIMEOUT):
        """Like :meth:`rpc_sync`, but each method call returns a Future."""
        return _Proxy(self, "rpc_async", timeout)

    def remote(self, timeout=constants.UNSET_RPC_TIMEOUT):
        """Like :meth:`rpc_sync`, but each method call returns an RRef of its result,
        owned by this RRef's owner. A method the value's type lacks raises
        AttributeError at once, as upstream (the first such call asks the
        owner for the type; see :meth:`_get_type`)."""
        return _Proxy(self, "remote", timeout)

    def backward(self, dist_autograd_ctx_id=-1, retain_graph=False):
        """Runs the backward pass from this RRef's value (a one-element tensor), on its owner.

        With a context id, it is a distributed backward pass in that context
        (see :func:`torchrpc.autograd.backward`; read the gradients with
        :func:`torchrpc.autograd.get_gradients`). With the default -1, it is a
        local ``value.backward()``, which only the owner may run.

        Raises:
            RuntimeError: a user RRef without a context id, a value that is not
                a tensor, or an unknown context (upstream's errors).
        """
        if not self.is_owner():
            if dist_autograd_ctx_id == -1:
                raise RuntimeError(
                    f"{self!r}.backward() runs a local backward pass on its owner, so it needs a "
                    "distributed autograd context here: pass backward(context_id) from "
                    "`with torchrpc.autograd.context() as context_id` (User RRefs require "
                    "'dist_autograd_ctx_id' to be specified)")
            args = (self, dist_autograd_ctx_id, retain_graph)
            return dispatch.invoke("rpc_sync", self.owner(), _backward_on_owner, args).wait()
        return _backward_on_owner(self, dist_autograd_ctx_id, retain_graph)

    # ---- pickling and conversion, as the lower layers see an RRef ----------

    def _fork(self, request_to=-1):
        """Fork data for sending this RRef to another worker;
        `request_to`: the callee's rank, when it goes in a request."""
        return state.require("sending an RRef").rref_ctx.fork(self._handle, request_to)

    def _torchrpc_reference(self, request_to):
        """python_fallback's pickler: (rebuild, fork), rebuilt by rebuild(fork)."""
        return _receive, self._fork(request_to)

    def _torchrpc_unconfirmed(self):
        """python_fallback's unpickler: the handle a call waits for, or None."""
        return None if self._handle.confirmed() else self._handle

    def _torchrpc_script_value(self):
        """dispatch's retry for TorchScript and builtin callees: the TorchScript RRef."""
        return self.to_script()

    def __reduce__(self):
        raise RuntimeError(
            "Can not pickle rref in python pickler: an RRef can only be pickled by torchrpc, as an argument "
            "or result of an RPC; "
            "it cannot be saved or sent by other means."
        )

    def __str__(self):
        """As upstream prints an RRef (its ids)."""
        if self._handle.is_owner():
            return f"OwnerRRef({_global_id(self._handle.id())})"
        return (f"UserRRef(RRefId = {_global_id(self._handle.id())}, "
                f"ForkId = {_global_id(self._handle.fork_id())})")

    def __repr__(self):
        session = state.current()
        owner = self._handle.owner()
        info = session.worker_at(owner) if session is not None else None
        name = info.name if info is not None else owner
        if self._handle.is_owner():
            return f"OwnerRRef(owner={name}, id={self._handle.id()})"
        return f"UserRRef(owner={name}, id={self._handle.id()}, fork={self._handle.fork_id()})"


def _rref_typeof_on_owner(rref):
    """Runs on the owner: the type of the RRef's value (upstream's name, which
    its profiler shows)."""
    return type(rref.local_value())


def _done(value):
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def _no_value(_):
    return None


def _global_id(text):
    """'0:1' (the handle's id text) as upstream prints an id."""
    created_on, _, local_id = text.partition(":")
    return f"GloballyUniqueId(created_on={created_on}, local_id={local_id})"


def _backward_on_owner(rref, context_id, retain_graph):
    """Runs on the owner: backward from the RRef's value, once it exists."""
    return _when_created(rref, lambda: _backward_from_value(rref, context_id, retain_graph))


def _backward_from_value(rref, context_id, retain_graph):
    value = rref.local_value()
    if not isinstance(value, torch.Tensor):
        raise RuntimeError(f"RRef.backward() needs an RRef of a tensor; {rref!r} holds a "
                           f"{type(value).__name__} (RRef should contain a tensor for .backward())")
    if context_id == -1:
        value.backward(retain_graph=retain_graph)
    else:
        autograd.backward(context_id, [value], retain_graph=retain_graph)


def _receive(fork_data):
    """Unpickling: the RRef that fork_data names, on this worker."""
    return RRef._wrap(state.require("receiving an RRef").rref_ctx.receive(fork_data))


def _from_script_object(obj):
    """The torchrpc.RRef of a TorchScript RRef object, or None."""
    handle = native().rref_of_script_object(obj)
    return None if handle is None else RRef._wrap(handle)


def _script_class_type():
    """The JIT type of torch.classes.torchrpc.RRef (registered by libtorchrpc)."""
    schema = torch._C.parse_schema("f(__torch__.torch.classes.torchrpc.RRef rref) -> ()")
    return schema.arguments[0].type


try:
    # `torchrpc.RRef` in an annotation of scripted code means the TorchScript
    # RRef; Python RRefs passed where TorchScript expects Any infer that type,
    # and python_fallback finds RRef here when it pickles a TorchScript RRef.
    torch.jit._state._add_script_class(RRef, _script_class_type())
except Exception:  # pragma: no cover - the native core failed to load; native() says why
    pass


def _invoke_method(rref, name, args, kwargs):
    """Runs on the owner: a method of the RRef's value. An @async_execution
    method's future is answered when it completes (rpc_sync/rpc_async proxies)."""
    return _when_created(rref, lambda: _run_method(rref, name, args, kwargs))


def _when_created(rref, run):
    """On the owner, in a Python call: run() now if the RRef's value exists
    (or failed); else a Deferred answered with run()'s outcome once it does,
    run then by a pool thread (never by the I/O or timer thread that may
    complete the value). No pool thread waits meanwhile."""
    pending = rref._handle.pending_value() if rref._handle.is_owner() else None
    if pending is None:
        return run()
    answer = torch.futures.Future()

    def created(_):
        try:
            result = run()
        except BaseException as exc:  # the call's answer: the owner's error or run()'s
            answer.set_exception(exc)
            return
        if isinstance(result, functions.Deferred):
            result.future.add_done_callback(lambda done: _settle(answer, done))
        else:
            answer.set_result(result)

    pending.add_done_callback(created)
    return functions.Deferred(answer)


def _run_method(rref, name, args, kwargs):
    value = rref.local_value()
    why = python_fallback.method_refusal(value, name)
    if why is not None:
        raise errors.CalleePolicyError(why)
    method = getattr(value, name)
    result = method(*args, **kwargs)
    return functions.Deferred(result) if functions.is_async_execution(method) else result


def _settle(answer, done):
    """Completes future `answer` as future `done` completed."""
    try:
        answer.set_result(done.wait())
    except BaseException as exc:
        answer.set_exception(exc)


python_fallback.method_runners.append(_invoke_method)


def _method_call(call_kind, rref, name, args, kwargs, timeout):
    """A proxy's call rref.<call_kind>().name(*args, **kwargs) as an
    RREF_METHOD_CALL: the arguments travel as IValues and the owner calls the
    method on its value, with no pickle and no fork of the RRef (faster than
    the pickled call). None when an argument is not plain
    (python_fallback::plainIValue), the RRef is the owner's own, or torchrpc
    is not running: the caller then sends the pickled call."""
    session = state.current()
    if session is None or rref._handle.is_owner():  # the owner's own proxy: a pickled call to itself
        return None
    seconds = session.timeout(timeout, call_kind)
    call = session.rref_ctx.method_call(rref._handle, name, args, kwargs, seconds, call_kind)
    return None if call is None else Invocation(call, python_fallback.decode_value)


def _check_method(rref, name, timeout):
    """Raises AttributeError at once if the value's type lacks method `name`
    (as upstream's proxies do; the type is asked of the owner once)."""
    value_type = rref._get_type(timeout)
    if issubclass(value_type, (torch.jit.ScriptModule, torch._C.ScriptModule)) or hasattr(value_type, name):
        return
    raise AttributeError(f"{value_type.__name__!r} object has no attribute {name!r} (the value of {rref!r})")


class _Proxy:
    __slots__ = ("_rref", "_kind", "_timeout")

    def __init__(self, rref, kind, timeout):
        self._rref = rref
        self._kind = kind
        self._timeout = timeout

    def __getattr__(self, name):
        rref, kind, timeout = self._rref, self._kind, self._timeout

        def method(*args, **kwargs):
            pickled = (rref, name, args, kwargs)
            if kind == "remote":
                _check_method(rref, name, timeout)
                return RRef._wrap(dispatch.invoke(kind, rref.owner(), _invoke_method, pickled, None, timeout))
            # Plain arguments: sent as IValues, not pickled (see _method_call).
            invocation = _method_call(kind, rref, name, args, kwargs, timeout)
            if invocation is None:
                invocation = dispatch.invoke(kind, rref.owner(), _invoke_method, pickled, None, timeout)
            return invocation.wait() if kind == "rpc_sync" else invocation.future()

        method.__name__ = name
        return method

    def __repr__(self):
        return f"<{self._kind} proxy of {self._rref!r}>"


def _live_rrefs():
    """This worker's RRef tables (for tests and debugging).

    Returns a dict: ``owners`` (rrefId, forks, ready, failed) the owner tracks
    for users; ``owner_objects`` (every live owner RRef id); ``users`` (rrefId,
    forkId, owner rank, confirmed, deleted); ``pending_users`` and
    ``pending_children`` (fork ids awaiting confirmation); ``in_flight``
    (protocol messages not yet answered).
    """
    session = state.current()
    if session is None:
        return {"owners": [], "owner_objects": [], "users": [], "pending_users": [],
                "pending_children": [], "in_flight": 0}
    return session.rref_ctx.snapshot()


def _wait_idle(timeout=10.0):
    """Waits until this worker's RRef protocol messages were answered; returns how many are not."""
    session = state.current()
    return 0 if session is None else session.rref_ctx.wait_idle(timeout)
