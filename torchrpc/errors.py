"""Every exception torchrpc raises on purpose.

All derive from :class:`RpcError`, itself a ``RuntimeError``, so code written
for ``torch.distributed.rpc`` (which raises ``RuntimeError``) keeps working.
Argument mistakes raise ``TypeError`` / ``ValueError`` instead; where
upstream raises ``RuntimeError`` for one, the class derives from both.
"""

import builtins
import importlib


class RpcError(RuntimeError):
    """Base class of the errors of an RPC call."""


class RpcTimeoutError(RpcError, TimeoutError):
    """A call's deadline passed before its response arrived."""


class PeerUnreachableError(RpcError, ConnectionError):
    """The connection to the callee failed or closed before the response
    arrived (the peer exited, crashed, or shut down)."""


class RemoteError(RpcError):
    """The callee raised an exception whose type cannot be rebuilt here.

    Attributes:
        remote_type (str): qualified name of the exception type on the callee.
        remote_traceback (str): the callee's traceback text.
    """

    def __init__(self, message, remote_type="", remote_traceback=""):
        super().__init__(message)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback


class UnknownFunctionError(RpcError, LookupError):
    """The callee has no function by the name (or hash) the call gave.

    A caller that passes the function object itself never sees it: torchrpc
    then sends the function (pickled, or as TorchScript code) and retries.
    """

    REMOTE_TYPE = "torchrpc.errors.UnknownFunctionError"  # as callees report it


class FunctionNotOnCalleeError(RpcError, AttributeError):
    """The callee cannot load a Python function the caller sent by
    reference: its module there lacks it (upstream raises RuntimeError
    "RPC pickler does not serialize the function code")."""


class CalleePolicyError(RpcError, PermissionError):
    """A worker's callee policy (``RpcOptions`` script_only,
    allowed_callables, allow_import_by_name, allow_shipped_code) refused a
    call: the callee would not run it, or this worker would not send it or
    take its pickled result. The message says what was refused, by which
    worker and which option; see docs/threat-model.md."""

    REMOTE_TYPE = "torchrpc.errors.CalleePolicyError"  # as callees report it


class UnknownWorkerError(RpcError, ValueError):
    """A call names no worker of the job (upstream raises RuntimeError
    "could not find destination")."""


class InvalidWorkerNameError(RpcError, ValueError):
    """A worker name that is empty, too long, has characters outside
    letters, digits, ``_``, ``-``, ``.`` and ``:``, or is already taken."""


class ScriptArgumentError(RpcError, TypeError):
    """A call's arguments do not match its TorchScript function's or its
    builtin operator's schema (upstream raises RuntimeError)."""


class NotInitializedError(RpcError):
    """A torchrpc function was used before init_rpc() or after shutdown()."""


class ShutdownError(RpcError):
    """The local worker shut down while the call was pending."""


# Kinds reported by the native core (csrc/common/error.h, ErrorKind).
_KIND_GENERIC, _KIND_TIMEOUT, _KIND_PEER, _KIND_REMOTE, _KIND_SHUTDOWN, _KIND_INVALID = range(6)

_BY_KIND = {
    _KIND_GENERIC: RpcError,
    _KIND_TIMEOUT: RpcTimeoutError,
    _KIND_PEER: PeerUnreachableError,
    _KIND_SHUTDOWN: ShutdownError,
    _KIND_INVALID: ValueError,  # refused before anything was sent: the caller's mistake
}


def _remote_type(qualname):
    """The exception class named by the callee, if it exists here."""
    module_name, _, name = qualname.rpartition(".")
    try:
        module = importlib.import_module(module_name) if module_name else builtins
        cls = getattr(module, name)
    except (ImportError, AttributeError, ValueError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None


def _remote_exception(message, remote_type, remote_traceback):
    cls = _remote_type(remote_type)
    exc = None
    if cls is not None and not issubclass(cls, (KeyboardInterrupt, SystemExit)):
        try:
            exc = cls(message)
        except Exception:  # the type's constructor wants other arguments
            exc = None
    if exc is None:
        exc = RemoteError(f"{remote_type}: {message} (Original exception on remote side was {remote_type}; "
                          "it could not be rebuilt on this worker)", remote_type, remote_traceback)
    if remote_traceback:
        exc.add_note("Remote traceback:\n" + remote_traceback.rstrip())
    exc.remote_type = remote_type
    exc.remote_traceback = remote_traceback
    return exc


# Attributes that C exception types keep outside __dict__ (StopIteration,
# SystemExit, ImportError, OSError, SyntaxError, UnicodeError, ...).
_SLOT_ATTRIBUTES = ("value", "code", "name", "path", "msg", "errno", "strerror", "filename", "filename2",
                    "lineno", "offset", "text", "end_lineno", "end_offset", "encoding", "object", "start",
                    "end", "reason", "characters_written")


def raised_copy(exc):
    """A copy of `exc` to raise in its place: its type, args, attributes,
    cause and context, and no traceback; `exc` itself if it cannot be copied.

    A future failed with a Python exception raises such a copy from each
    wait() (csrc/python_fallback/callback_runner.cpp): raising the stored
    object itself would append the waiting frames to its traceback, and the
    future, which holds it in C++ where the garbage collector cannot see,
    would keep those frames, and all they reference, alive for good."""
    cls = type(exc)
    try:
        copy = cls.__new__(cls, *exc.args)
        copy.args = exc.args
        copy.__dict__.update(exc.__dict__)
    except Exception:  # a type whose __new__ wants other arguments
        return exc
    for name in _SLOT_ATTRIBUTES:
        if name not in exc.__dict__ and hasattr(exc, name):
            try:
                setattr(copy, name, getattr(exc, name))
            except (AttributeError, TypeError):
                pass
    copy.__cause__ = exc.__cause__
    copy.__context__ = exc.__context__
    copy.__suppress_context__ = exc.__suppress_context__
    return copy


def from_native(info):
    """Builds the exception for an error reported by the native core.

    Args:
        info (tuple): (kind, message, remote_type, remote_traceback).
    """
    kind, message, remote_type, remote_traceback = info
    if kind == _KIND_REMOTE:
        return _remote_exception(message, remote_type, remote_traceback)
    return _BY_KIND.get(kind, RpcError)(message)
