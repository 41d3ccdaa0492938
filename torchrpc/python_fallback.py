"""The Python fallback: calls of plain Python callables.

Caller side: the callable is pickled (torchrpc.callables: by reference or
with cloudpickle); the bytes are hashed,
and once a peer has received a function, later calls send only its hash.
Functions that pickle by reference (importable module-level functions) are
pickled once and cached; closures and lambdas are pickled on every call, so
their captured values are always current, and still sent by hash when the
bytes are unchanged. Arguments and results use Python's pickle, with
tensors taken out and sent as raw bytes beside it, except plain ones
(tensors, numbers, strings, and tuples, lists and dicts of them:
plainIValue in csrc), which travel as IValues with no pickle either way:
results always, arguments once the function goes by hash. An object that
travels by reference (an RRef) has ``_torchrpc_reference(request_to)``,
which returns ``(rebuild, fork)``: the pickle carries the fork and names
``rebuild``, which makes the object again on the receiver, so this module
never imports RRef.
There its ``_torchrpc_unconfirmed()`` names what a call that received it
waits for before it runs (an RRef that its owner has not confirmed yet).
Types that pickle differently through RPC than elsewhere (RemoteModule)
register a reducer with :func:`register_reducer`.

Callee side (:func:`handle_call`, run by the native bridge under the GIL):
unpickle, run, hand the result to the bridge (which pickles it with
:func:`encode_value` unless it is plain), or report the exception with its
type, message and traceback.

RRef proxies (``rref.rpc_sync().m(x)``) skip pickling when every argument is
a plain value (python_fallback::plainIValue in csrc): the call travels as
IValues (RREF_METHOD_CALL), the owner runs it with :func:`handle_method`, and
a plain result comes back as an IValue.
"""

import collections
import copyreg
import importlib
import io
import pickle
import threading
import traceback
import types

import cloudpickle
import torch

from torchrpc import callables, errors, functions, log, state
from torchrpc._extension import native


_lock = threading.Lock()
_sent = set()  # (peer rank, hash) pairs the peer has decoded in full (its answer came)
_received = {}  # hash -> function (callee side)
_MAX_RECEIVED = 4096


# ---- pickling with tensors out of band -------------------------------------

def script_reference(fn):
    """(qualified name, module to import) of a TorchScript function: what a
    receiver needs to find the same function (see resolve_script)."""
    qualified = fn.qualified_name
    module = qualified[len("__torch__."):] if qualified.startswith("__torch__.") else ""
    return qualified, module.rpartition(".")[0]


# type -> reducer, for the objects that pickle only through RPC (register_reducer).
_reducers = {}


def register_reducer(cls, reducer):
    """Pickles instances of exactly `cls` as ``reducer(obj)`` (a
    ``__reduce__`` value) when they travel through RPC; elsewhere their own
    pickling applies (RemoteModule refuses it)."""
    _reducers[cls] = reducer


# Types that never travel out of band. The pickler asks persistent_id about
# every object it meets (some 20 per proxy call); these answer at once.
_PLAIN_TYPES = frozenset({str, bytes, int, float, bool, type(None), tuple, list, dict})


class _Pickler(pickle.Pickler):
    def __init__(self, file, tensors, request_to):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._tensors = tensors
        self._request_to = request_to
        self._forks = []

    dispatch_table = collections.ChainMap(_reducers, copyreg.dispatch_table)

    def persistent_id(self, obj):
        kind = type(obj)
        if kind in _PLAIN_TYPES:  # most of what a call pickles: one set lookup
            return None
        if kind is torch.Tensor or kind is torch.nn.Parameter:
            self._tensors.append(obj)
            return (len(self._tensors) - 1, kind is torch.nn.Parameter, obj.requires_grad)
        if isinstance(obj, torch.jit.ScriptFunction):
            return ("script", *script_reference(obj))  # the receiver resolves it by name
        if isinstance(obj, torch.jit.ScriptModule):  # its code and state, as torch.jit.save writes them
            buffer = io.BytesIO()
            torch.jit.save(obj, buffer)
            return ("module", buffer.getvalue())
        if kind is torch.ScriptObject:  # a TorchScript RRef travels as the RRef
            obj = _python_face(obj)
            kind = type(obj)
        reference = getattr(kind, "_torchrpc_reference", None)
        if reference is not None:  # an RRef: its fork (csrc/rref), rebuilt by `rebuild`
            rebuild, fork = reference(obj, self._request_to)
            self._forks.append(fork)
            return ("ref", rebuild, fork)
        return None


def _python_face(obj):
    """A TorchScript object as an instance of the Python class registered for
    its type, when that class travels by reference (torchrpc.rref registers
    RRef for torch.classes.torchrpc.RRef); otherwise obj itself."""
    cls = torch.jit._state._get_python_class(obj._type().qualified_name())
    if cls is None or not hasattr(cls, "_torchrpc_reference"):
        return obj
    return cls.from_script(obj)


class _CloudPickler(cloudpickle.CloudPickler):
    def __init__(self, file, tensors, request_to):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._tensors = tensors
        self._request_to = request_to
        self._forks = []

    dispatch_table = collections.ChainMap(_reducers, cloudpickle.CloudPickler.dispatch_table)
    persistent_id = _Pickler.persistent_id


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, tensors, awaited=None):
        super().__init__(file)
        self._tensors = tensors
        self._awaited = awaited

    def persistent_load(self, pid):
        if pid[0] == "ref":
            obj = pid[1](pid[2])  # e.g. torchrpc.rref._receive(fork)
            if self._awaited is not None:
                unconfirmed = obj._torchrpc_unconfirmed()
                if unconfirmed is not None:
                    self._awaited.append(unconfirmed)
            return obj
        if pid[0] == "module":
            return torch.jit.load(io.BytesIO(pid[1]))
        if pid[0] == "script":
            try:
                fn = resolve_script(pid[1], pid[2])
            except ImportError:
                fn = None
            if fn is None:
                raise pickle.UnpicklingError(
                    f"no TorchScript function named {pid[1]!r} here; import {pid[2] or 'its module'} "
                    "on this worker")
            return fn
        index, is_parameter, requires_grad = pid
        t = self._tensors[index]
        if t.grad_fn is not None:
            return t  # received in a distributed autograd context: keep its history
        if is_parameter:
            return torch.nn.Parameter(t, requires_grad=requires_grad)
        if requires_grad:
            t.requires_grad_(True)
        return t


def dumps(obj, request_to=-1):
    """Pickles obj; returns (bytes, tensors, forks): forks are the RRefs'
    fork data. `request_to`: the callee's rank when obj is a request to it
    (its RRefs owned there are then released by the answer, see
    RRefContext::fork)."""
    tensors = []
    buf = io.BytesIO()
    pickler = _Pickler(buf, tensors, request_to)
    try:
        pickler.dump(obj)
    except Exception:
        _cancel_forks(pickler)
        # Lambdas, closures, local classes: cloudpickle handles them.
        tensors.clear()
        buf = io.BytesIO()
        pickler = _CloudPickler(buf, tensors, request_to)
        try:
            pickler.dump(obj)
        except BaseException:
            _cancel_forks(pickler)
            raise
    return buf.getvalue(), tensors, pickler._forks


def _cancel_forks(pickler):
    cancel_forks(pickler._forks)


def cancel_forks(forks):
    """Undoes the RRef forks of a pickle that will not be sent."""
    session = state.current()
    if session is not None:
        for fork in forks:
            session.rref_ctx.cancel_fork(fork)


def loads(data, tensors, awaited=None):
    """Unpickles what dumps() made, once checked. `awaited`, a list, receives
    the native handles of the RRefs in it that their owners have not confirmed yet."""
    callables.check_received(data, "a peer's pickle")
    return _Unpickler(io.BytesIO(data), list(tensors), awaited).load()


# ---- caller side -------------------------------------------------------------

def encode_call(fn, dst_rank, args, kwargs, force_full=False, request=True):
    """Returns (message, name, forks, unconfirmed) for a call of fn on
    dst_rank. `request`: the answer to this message proves the callee decoded
    it (an rpc_sync/rpc_async call; not remote(), whose answer may come first).
    `unconfirmed`: the (peer, hash) to pass to confirm_sent once that answer
    came, if the function travels in full; until then every call sends it in
    full, so a call that overtakes the first never names a hash the callee
    lacks (its resend would record a second send in an autograd context).
    A call by hash whose arguments are all plain travels as IValues, with no
    pickle (python_fallback::plainPythonCallMessage in csrc)."""
    digest, data = callables.pickle_function(fn)
    key = (dst_rank, digest)
    with _lock:
        full = force_full or key not in _sent
    name = callables.function_name(fn)
    if not full:
        message = native().plain_python_message(digest, name, args, kwargs)
        if message is not None:
            return message, name, (), None
    payload, tensors, forks = pickled_call(digest, data if full else None, name, args, kwargs,
                                           dst_rank if request else -1)
    return native().python_message(payload, tensors), name, forks, key if full and request else None


def pickled_call(digest, data, name, args, kwargs, request_to=-1):
    """(payload, tensors, forks) of a PYTHON_CALL's pickle: the function's
    hash, its pickle_function bytes (None to send the hash alone), its name
    and the arguments."""
    try:
        return dumps((digest, data, name, args, kwargs), request_to)
    except Exception as err:
        raise _pickling_error(err, f"cannot send the arguments of {name!r}: pickling failed: {err}") from err


def confirm_sent(key):
    """The peer of `key` (from encode_call) decoded the whole function: later calls send its hash."""
    with _lock:
        _sent.add(key)


def forget_sent(dst_rank=None):
    """Forgets which functions peers have (on an unknown-hash reply, or shutdown)."""
    with _lock:
        if dst_rank is None:
            _sent.clear()
        else:
            for key in [k for k in _sent if k[0] == dst_rank]:
                _sent.discard(key)


def decode_result(value):
    """Decodes a PYTHON_RET value: (payload as uint8 tensor, tensors).
    See decode_value for an answer that may be either."""
    payload, tensors = value
    return loads(payload.numpy(), tensors)


def decode_value(value):
    """Decodes an answer with a Python value (a Python call's, RREF_FETCH,
    RREF_METHOD_CALL): a 1-tuple holding an IValue (a plain value, which
    travels without a pickle), or a PYTHON_RET value."""
    if len(value) == 1:
        return value[0]
    return decode_result(value)


# ---- callee side -------------------------------------------------------------

def _qualified_type(exc):
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _pickling_error(err, message):
    """`message` as an exception of the class pickling raised (so code that
    catches it under torch.distributed.rpc, which pickles the same objects,
    still does), or a TypeError where that class wants other arguments."""
    try:
        return type(err)(message)
    except Exception:
        return TypeError(message)


def _error(exc, name):
    tb = "".join(traceback.format_exception(exc))
    return ("err", _qualified_type(exc), str(exc), tb, name)


def _stateless(fn):
    """Whether one unpickled copy of fn may serve every call. Objects, bound
    methods and closures carry state a call may change, so they are unpickled
    afresh for each call, as the caller's copy was when it was sent."""
    if isinstance(fn, (types.BuiltinFunctionType, type)):
        return True
    return isinstance(fn, types.FunctionType) and fn.__closure__ is None


def _finish(result, name, fn, now, later=None):
    """The outcome of callee `fn` that returned `result`: now(result) for an
    ordinary result. For an @async_execution callee (or an async method called
    through an RRef proxy, wrapped in functions.Deferred): ("async", future)
    whose value is later(done, name) (default _outcome), on which the native
    bridge acts when it completes (no thread waits for it); or ("err", ...)
    if the callee returned no future."""
    deferred = isinstance(result, functions.Deferred)
    if not (deferred or functions.is_async_execution(fn)):
        return now(result)
    future = result.future if deferred else result
    if not isinstance(future, torch._C.Future):
        return _error(RuntimeError(
            f"{name!r} is decorated with @torchrpc.functions.async_execution, so it must return a "
            f"torch.futures.Future of its result. Functions decorated with @rpc.async_function must "
            f"return a torch.futures.Future object, but got {type(future).__name__}"), name)
    later = later or _outcome
    return ("async", future.then(lambda done: later(done, name)))


def handle_call(payload, tensors, caller_rank):
    """Runs one Python call. Called by the native bridge with the GIL held."""
    return _run(payload, tensors, _call_outcome)


def _call_outcome(result, name, fn):
    # The bridge sends a plain result as an IValue, and pickles any other
    # with encode_value (run_python.h valueResponse).
    return _finish(result, name, fn, lambda value: ("value", value, name))


def handle_method(obj, name, args, kwargs):
    """Runs obj.name(*args, **kwargs) for an RREF_METHOD_CALL (a proxy's call
    of a method of an RRef's value), on the owner. Called by the native bridge
    with the GIL held. Returns ("value", result, label): the bridge sends a
    plain result as an IValue and pickles any other (encode_value(result,
    label)); or ("err", ...), or ("async", future) as handle_call does."""
    label = f"{type(obj).__qualname__}.{name}"
    why = method_refusal(obj, name)
    if why is not None:
        return ("err", errors.CalleePolicyError.REMOTE_TYPE, why, "", label)
    try:
        method = getattr(obj, name)
        result = method(*args, **kwargs)
    except BaseException as exc:  # everything the user code raises goes back
        return _error(exc, label)
    return _finish(result, label, method, lambda value: ("value", value, label))


def handle_remote(payload, tensors, caller_rank):
    """Runs the Python call of a remote() on the owner; returns ("ok", value)
    (the owner keeps the object), ("async", future of that outcome) for an
    @async_execution function or method, or ("err", ...)."""
    return _run(payload, tensors, _value_outcome)


def _value_outcome(result, name, fn):
    # The owner's value is what the future gives.
    return _finish(result, name, fn, lambda value: ("ok", value), _remote_outcome)


def _remote_outcome(fut, name):
    """("ok", value) or ("err", ...) of an @async_execution remote()'s future."""
    try:
        return ("ok", fut.wait())
    except BaseException as exc:
        return _error(exc, name)


def encode_value(value, name="<value>"):
    """Pickles a result or an RRef's value: ("ok", payload, tensors) or ("err", ...)."""
    try:
        out, out_tensors, _ = dumps(value)
    except BaseException as exc:
        return _error(_pickling_error(exc, f"the result of {name!r} cannot be pickled: {exc}"), name)
    return ("ok", out, out_tensors)


# The functions that run a method of an RRef's value for a proxy whose call
# was pickled (torchrpc.rref adds its runner): allowed_callables is checked
# against that method (method_refusal), not against them.
method_runners = []


def _allowlist_agent():
    """The agent that checks RpcOptions(allowed_callables=...) of this worker,
    or None when everything is allowed (at once: this runs on every call)."""
    session = state.current()
    return None if session is None or session.options.allowed_callables is None else session.agent


def method_refusal(obj, name):
    """Why allowed_callables refuses the method obj.name, named
    "module.Class.method", or None."""
    agent = _allowlist_agent()
    if agent is None:
        return None
    cls = type(obj)
    return agent.callable_refusal(f"{cls.__module__}.{cls.__qualname__}.{name}")


def _function_refusal(fn):
    """Why allowed_callables refuses the loaded callee fn, or None."""
    agent = _allowlist_agent()
    if agent is None or any(fn is runner for runner in method_runners):
        return None
    return agent.callable_refusal(_qualified_name(fn))


def _qualified_name(fn):
    """'module.qualname' of a loaded callee, as allowed_callables names it."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', None) or type(fn).__module__}.{name}"


def _run(payload, tensors, outcome):
    """Unpickles and runs a call: outcome(result, name, function), or ("err", ...).
    With an allowlist, the loaded function's own name (not the one the caller
    gives) is checked before it runs. A call whose arguments hold RRefs that
    their owners have not confirmed yet returns ("wait", their handles, run):
    as upstream, it runs only once they are confirmed, when the native bridge
    calls run()."""
    name = "<python call>"
    awaited = []
    try:
        # A plain call (callPythonHandler in csrc) comes decoded, without tensors.
        digest, data, name, args, kwargs = payload if tensors is None else loads(payload, tensors, awaited)
        if data is not None:
            fn = callables.load_function(data, name)
            with _lock:
                if len(_received) >= _MAX_RECEIVED:
                    _received.pop(next(iter(_received)))
                _received[digest] = fn if _stateless(fn) else data
        else:
            with _lock:
                fn = _received.get(digest)
            if fn is None:
                return ("err", errors.UnknownFunctionError.REMOTE_TYPE, f"function {name!r} is not cached here", "", name)
            if isinstance(fn, bytes):
                fn = callables.load_function(fn, name)
        why = _function_refusal(fn)
        if why is not None:
            return ("err", errors.CalleePolicyError.REMOTE_TYPE, why, "", name)
    except BaseException as exc:  # everything the user code raises goes back
        _log_callee_error(name, exc)
        return _error(exc, name)
    if awaited:
        return ("wait", awaited, lambda: _call(fn, name, args, kwargs, outcome))
    return _call(fn, name, args, kwargs, outcome)


def _call(fn, name, args, kwargs, outcome):
    try:
        result = fn(*(args or ()), **(kwargs or {}))
    except BaseException as exc:  # everything the user code raises goes back
        _log_callee_error(name, exc)
        return _error(exc, name)
    return outcome(result, name, fn)


def _log_callee_error(name, exc):
    """Says on this worker's stderr, as upstream does, that a call raised
    (the caller gets the error itself)."""
    session = state.current()
    where = session.me.name if session is not None else "this worker"
    log.warn_limited("callee_error", f"on {where}, {name!r} raised {_qualified_type(exc)}: {exc}")


def _outcome(fut, name):
    """The outcome tuple of an @async_execution function's future."""
    try:
        result = fut.wait()
    except BaseException as exc:
        return _error(exc, name)
    return encode_value(result, name)


def resolve_script(name, module_hint):
    """Finds the TorchScript function `name` in this process, importing
    `module_hint` first if needed. Called by the native registry on a miss."""
    cu = torch.jit._state._python_cu
    fn = cu.find_function(name)
    if fn is None and module_hint:
        importlib.import_module(module_hint)
        fn = cu.find_function(name)
    return fn
