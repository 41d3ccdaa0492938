"""The caller's one dispatch: classify a callee once, then send the call or
make it a ``remote()``.

A callee is a TorchScript function or exported program by the name the
callee knows (a str), a ``torch.jit.ScriptFunction``, a
``torch.export.ExportedProgram``, a builtin operator, or any other callable
(pickled with cloudpickle, :mod:`torchrpc.python_fallback`). Each kind is one
class below that builds the call's message; :func:`_start` then sends it
(rpc_sync, rpc_async: an :class:`~torchrpc.invocation.Invocation`) or makes
it a remote() (the new RRef's native handle, which :mod:`torchrpc.rref`
wraps).
"""

import torch

from torchrpc import callables, constants, errors, exported, functions, python_fallback, shipped_code, state
from torchrpc._extension import native
from torchrpc.invocation import Invocation, plain


def invoke(call_kind, to, func, args=None, kwargs=None, timeout=constants.UNSET_RPC_TIMEOUT):
    """Starts ``func(*args, **kwargs)`` on worker `to`; shared by rpc_sync,
    rpc_async, remote and the RRef proxies.

    Args:
        call_kind (str): "rpc_sync", "rpc_async" or "remote" (named in errors).

    Returns:
        An Invocation; for "remote", the new RRef's native handle.
    """
    callee, session, dst, args, kwargs, seconds = _prepare(call_kind, to, func, args, kwargs, timeout)
    return _with_script_values(_start, callee, call_kind, session, dst, args, kwargs, seconds)


def call_sync(to, func, args=None, kwargs=None, timeout=constants.UNSET_RPC_TIMEOUT):
    """rpc_sync: ``invoke("rpc_sync", ...).wait()``, with the call sent and
    waited for in one native call (no Invocation) unless its message
    carries RRefs to release when the callee answers."""
    callee, session, dst, args, kwargs, seconds = _prepare("rpc_sync", to, func, args, kwargs, timeout)
    message, function, forks = _with_script_values(_build, callee, "rpc_sync", session, dst, args, kwargs, seconds)
    if forks:
        return _send(callee, "rpc_sync", session, dst, args, kwargs, seconds, message, function, forks).wait()
    ok, value = session.agent.call(dst.id, message, seconds, "rpc_sync", function)
    if ok:
        return callee.decode(value)
    if value[2] == errors.UnknownFunctionError.REMOTE_TYPE and callee.resends:
        return _with_script_values(_start_again, callee, "rpc_sync", session, dst, args, kwargs, seconds).wait()
    raise errors.from_native(value)


def _prepare(call_kind, to, func, args, kwargs, timeout):
    """(callee, session, destination WorkerInfo, args tuple, kwargs dict,
    timeout seconds) of a call, checked."""
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
    return classify(call_kind, func), session, dst, tuple(args), kwargs, seconds


def _with_script_values(start, callee, call_kind, session, dst, args, kwargs, seconds):
    """start(callee, call_kind, session, dst, args, kwargs, seconds), tried
    once more with the RRefs among the arguments as TorchScript objects if
    it failed and the callee takes those."""
    try:
        return start(callee, call_kind, session, dst, args, kwargs, seconds)
    except (TypeError, RuntimeError) as err:
        # TorchScript and builtin callees take an RRef as its TorchScript object
        # (torch.classes.torchrpc.RRef): converted here, after the first attempt
        # failed on it (nothing was sent), so calls without RRefs pay nothing.
        if not callee.takes_script_values:
            raise
        converted = _to_script_values((args, kwargs))
        if converted is None:
            raise
        args, kwargs = converted
        try:
            return start(callee, call_kind, session, dst, args, kwargs, seconds)
        except (TypeError, RuntimeError) as again:
            raise again from err


def _build(callee, call_kind, session, dst, args, kwargs, seconds, again=False):
    """The call's (message, function name, RRef forks the message carries)."""
    return callee.build(call_kind, dst, args, kwargs, call_kind == "remote", again)


def _start(callee, call_kind, session, dst, args, kwargs, seconds, again=False):
    """Builds the call's message once, then sends it or makes it a remote().
    `again`: the resend of a call whose callee lacked the function (with its
    code, or its whole pickle)."""
    message, function, forks = _build(callee, call_kind, session, dst, args, kwargs, seconds, again)
    return _send(callee, call_kind, session, dst, args, kwargs, seconds, message, function, forks, again)


def _start_again(callee, call_kind, session, dst, args, kwargs, seconds):
    """_start of the resend of a call whose callee lacked the function."""
    return _start(callee, call_kind, session, dst, args, kwargs, seconds, again=True)


def _send(callee, call_kind, session, dst, args, kwargs, seconds, message, function, forks, again=False):
    """Sends a built message, or makes it a remote(): an Invocation, or the new RRef's native handle."""
    try:
        if call_kind == "remote":
            return session.rref_ctx.remote(dst.id, message, seconds, function)
        call = session.agent.send(dst.id, message, seconds, call_kind, function)
    except BaseException:
        # A message that could not be sent (e.g. a sparse tensor the wire
        # refuses) carried no RRef: its forks are undone, so nothing holds those RRefs.
        python_fallback.cancel_forks(forks)
        raise
    if forks:  # RRefs sent to their owner: released when it answers
        session.rref_ctx.release_when_answered(call, forks)
    if again or not callee.resends:
        return Invocation(call, callee.decode)
    return _Resendable(call, callee, call_kind, session, dst, args, kwargs, seconds)


class _Resendable(Invocation):
    """A call that is sent once more, with the function itself, if its callee
    lacks it: it keeps what _start was given (its own slots, not a closure,
    so a call in flight allocates nothing more; nothing refers back to it,
    so no cycle keeps the arguments alive)."""

    __slots__ = ("_callee", "_call_kind", "_session", "_dst", "_args", "_kwargs", "_seconds")

    def __init__(self, call, callee, call_kind, session, dst, args, kwargs, seconds):
        super().__init__(call, callee.decode)
        self._callee, self._call_kind, self._session, self._dst = callee, call_kind, session, dst
        self._args, self._kwargs, self._seconds = args, kwargs, seconds

    def resend(self):
        return _start(self._callee, self._call_kind, self._session, self._dst, self._args, self._kwargs,
                      self._seconds, again=True)


def classify(call_kind, func):
    """The callee kind of `func`: a TorchScript function (by name or object),
    then a builtin operator, then any other callable. A TorchScript function's
    and a builtin's are kept, by the object's identity, so that the next call
    of it pays one lookup."""
    entry = _classified.get(id(func))
    if entry is not None and entry[0] is func and entry[2] == state.callees_generation:
        return entry[1]
    callee = _classify(call_kind, func)
    if isinstance(callee, (_Script, _Builtin)):
        if len(_classified) >= _MAX_CLASSIFIED:  # functions made on the fly: keep no more than this
            _classified.clear()
        _classified[id(func)] = (func, callee, state.callees_generation)
    return callee


# id(func) -> (func, its callee, state.callees_generation then). The
# entry holds func, so its id stays its own.
_classified = {}
_MAX_CLASSIFIED = 1024


def _classify(call_kind, func):
    if isinstance(func, str):
        return _Named(func)
    if isinstance(func, torch.jit.ScriptFunction):
        return _Script(func)
    if exported.is_exported_program(func):
        return _Exported(func)
    builtin = _builtin_name(func) if callable(func) else None
    if builtin is not None:
        return _Builtin(builtin)
    if not callable(func):
        raise TypeError(f"{call_kind}(func=...) expects a callable; got {type(func).__name__}")
    if getattr(func, "__module__", None) == "torch.distributed.nn.api.remote_module":
        raise TypeError(f"{call_kind}(func={getattr(func, '__qualname__', func)!r}): torch.distributed.nn's "
                        "RemoteModule works only with torch.distributed.rpc; with torchrpc use "
                        "torchrpc.nn.RemoteModule (same arguments)")
    return _Python(func)


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


class _Callee:
    """One kind of callee: build(call_kind, dst, args, kwargs, remote, again)
    returns the call's (native message, function name, RRef forks it made)."""

    __slots__ = ("target",)
    takes_script_values = True  # RRef arguments may be retried as TorchScript RRefs
    resends = False  # a callee that lacks the function gets it on a second try
    decode = staticmethod(plain)  # the response's value -> the result

    def __init__(self, target):
        self.target = target


class _Named(_Callee):
    """A TorchScript function by the name the callee knows (given to register)."""

    __slots__ = ()

    def build(self, call_kind, dst, args, kwargs, remote, again):
        return native().named_message(self.target, args, kwargs, call_kind), self.target, ()


class _Script(_Callee):
    """A ``torch.jit.ScriptFunction``: sent by its registered or qualified name,
    and resent once with its code if the callee lacks it (shipped_code);
    remote() sends the name only."""

    __slots__ = ("name", "module", "is_async")
    resends = True

    def __init__(self, fn):
        super().__init__(fn)
        explicit = state.script_name(fn)
        self.name, self.module = (explicit, "") if explicit is not None else python_fallback.script_reference(fn)
        self.is_async = functions.is_async_execution(fn)

    def build(self, call_kind, dst, args, kwargs, remote, again):
        fn = self.target
        if remote:
            shipped = None
        else:
            shipped = shipped_code.with_code(fn, dst.id) if again else shipped_code.reference(fn, dst.id)
        try:
            message = native().script_message(self.name, self.module, fn, args, kwargs, shipped, self.is_async)
        except TypeError as err:  # the schema refused the arguments
            raise errors.ScriptArgumentError(str(err)) from None
        return message, self.name, ()


class _Exported(_Callee):
    """A ``torch.export.ExportedProgram``: compiled here once (cached on disk,
    torchrpc.exported), its package shipped to each callee once and called by
    hash. The first call to a callee sends the hash alone and is resent with
    the package if the callee lacks it; remote() has no resend, so it sends
    the package until that callee was sent it."""

    __slots__ = ()
    resends = True

    def build(self, call_kind, dst, args, kwargs, remote, again):
        ep = self.target
        if again or (remote and not shipped_code.shipped(ep, dst.id)):
            shipped = shipped_code.with_code(ep, dst.id)
        else:
            shipped = shipped_code.by_hash(ep)
        name = f"exported:{shipped[1][:12]}"
        return native().named_message(name, args, kwargs, call_kind, shipped), name, ()


class _Builtin(_Callee):
    """A builtin operator, by its schema name ('aten::add')."""

    __slots__ = ()

    def build(self, call_kind, dst, args, kwargs, remote, again):
        try:
            message, schema_name = native().builtin_message(self.target, args, kwargs)
        except TypeError as err:  # no overload takes the arguments
            raise errors.ScriptArgumentError(str(err)) from None
        return message, schema_name, ()


class _Python(_Callee):
    """Any other callable, pickled with cloudpickle and sent by hash once the
    callee has it; resent in full if the callee lost it. remote() always
    sends the whole function: the owner keeps no resend path."""

    __slots__ = ("unconfirmed",)
    takes_script_values = False
    resends = True

    def __init__(self, target):
        super().__init__(target)
        self.unconfirmed = None  # (peer, hash) of a function sent in full, until its answer

    @property
    def decode(self):
        # This callee itself (__call__): a bound method would be one more
        # object per call in flight for the garbage collector to walk.
        return self

    def __call__(self, value):
        result = python_fallback.decode_value(value)
        if self.unconfirmed is not None:  # the callee decoded the whole function: later calls send its hash
            python_fallback.confirm_sent(self.unconfirmed)
        return result

    def build(self, call_kind, dst, args, kwargs, remote, again):
        session = state.require()
        if session.options.script_only:
            # Its result would come back pickled, which this worker refuses to unpickle.
            raise errors.CalleePolicyError(
                f"{call_kind} of {callables.function_name(self.target)!r} refused on {session.me.name}: "
                "it is not TorchScript, so it would travel as a pickle and its result come back as one, and "
                f"{session.me.name} runs with RpcOptions(script_only=True), which sends and takes no pickle; "
                "decorate it with @torch.jit.script or call a builtin"
            )
        message, name, forks, self.unconfirmed = python_fallback.encode_call(
            self.target, dst.id, args, kwargs, force_full=again or remote, request=not remote)
        if torch.autograd._profiler_enabled():
            # The profiler names the call's range after it, as upstream: by __qualname__.
            name = getattr(self.target, "__qualname__", name)
        return message, name, forks


def _to_script_values(value):
    """`value` with every RRef (inside tuples, lists, dicts) replaced by its
    TorchScript object, or None when it holds no RRef."""
    script_value = getattr(type(value), "_torchrpc_script_value", None)
    if script_value is not None:  # an RRef
        return script_value(value)
    if isinstance(value, (tuple, list)):
        items = [_to_script_values(v) for v in value]
        if all(i is None for i in items):
            return None
        out = [v if i is None else i for v, i in zip(value, items)]
        return type(value)(out) if type(value) in (tuple, list) else tuple(out)
    if isinstance(value, dict):
        items = {k: _to_script_values(v) for k, v in value.items()}
        if all(i is None for i in items.values()):
            return None
        return {k: (v if items[k] is None else items[k]) for k, v in value.items()}
    return None
