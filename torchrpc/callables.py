"""How a Python callable travels: by reference (module and name) when the
callee can import it, or by value (cloudpickle) otherwise; a function of
the caller's ``__main__`` as the callee's own function of that name."""

import hashlib
import pickle
import sys
import threading
import types

import cloudpickle

from torchrpc import errors
from torchrpc._extension import native

_lock = threading.Lock()
_by_reference_cache = {}  # function -> (hash, bytes)


def function_name(fn):
    """'module.qualname' of a callable, as messages name it."""
    name = getattr(fn, "__qualname__", None) or getattr(type(fn), "__qualname__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module and module != "__main__" else name


def _module_level(fn):
    """Whether fn is reachable as module.qualname (so it pickles by name)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return False
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    # A classmethod (bound to its class) is a new object at each lookup.
    return obj is fn or (isinstance(fn, types.MethodType) and isinstance(fn.__self__, type) and obj == fn)


class _MainReference:
    """A function of the caller's ``__main__`` script. Every worker of a job
    usually runs the same script, so, as torch.distributed.rpc does, the
    callee uses its own ``__main__``'s function of that name (and its
    globals, e.g. a server object the script made). A callee running another
    program falls back to the pickled copy."""

    def __init__(self, qualname, by_value, why_no_copy=None):
        self.qualname = qualname
        self.by_value = by_value  # None when the function did not pickle (why_no_copy says why)
        self.why_no_copy = why_no_copy

    def resolve(self):
        obj = sys.modules.get("__main__")
        for part in self.qualname.split("."):
            obj = getattr(obj, part, None)
        if callable(obj):
            return obj
        if self.by_value is None:
            raise errors.FunctionNotOnCalleeError(
                f"{self.qualname!r} is a function of the caller's __main__ script, which this worker's __main__ "
                f"lacks, and the caller could not send a copy ({self.why_no_copy}): run the same script on "
                "every worker, or make what the function uses picklable")
        check_received(self.by_value, f"the copy of {self.qualname!r}")
        return cloudpickle.loads(self.by_value)


def _main_reference(fn):
    """A function of __main__ by name, with a copy for a callee that runs
    another program when the function pickles (a lock among its globals, say,
    does not: upstream sends such a function by name alone, and so does this)."""
    try:
        copy, why = cloudpickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL), None
    except Exception as err:
        copy, why = None, f"{type(err).__name__}: {err}"
    return _MainReference(fn.__qualname__, copy, why)


def pickle_function(fn):
    """(hash, bytes) of `fn`: by reference when its module names it, else by value."""
    by_name = _module_level(fn)
    if by_name:
        with _lock:
            cached = _by_reference_cache.get(fn)
        if cached is not None:
            return cached
    try:
        if by_name and fn.__module__ == "__main__":
            data = cloudpickle.dumps(_main_reference(fn), protocol=pickle.HIGHEST_PROTOCOL)
        elif by_name and isinstance(fn, types.MethodType):
            # By reference, as getattr(cls, name): cloudpickle would copy the function by value.
            data = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
        else:
            data = cloudpickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:
        raise TypeError(
            f"cannot send {function_name(fn)!r}: it is not TorchScript, so torchrpc pickled it "
            f"with cloudpickle, which failed: {err}. Decorate it with @torch.jit.script, or "
            "make the objects it captures picklable."
        ) from err
    entry = (hashlib.blake2b(data, digest_size=16).digest(), data)
    if by_name:
        with _lock:
            _by_reference_cache[fn] = entry
    return entry


def check_received(data, what):
    """Refuses a peer's pickle whose declared lengths or memo indices run
    past its end, before Python's unpickler reads it: that, as torch's,
    allocates what they declare (csrc/message/pickle_check.h)."""
    problem = native().check_pickle(data)
    if problem:
        raise pickle.UnpicklingError(f"{what}: {problem}")


def load_function(data, name):
    """The callable in `data` (pickle_function's bytes), on the callee."""
    check_received(data, f"the pickle of {name!r}")
    try:
        fn = cloudpickle.loads(data)
    except AttributeError as err:  # pickled by reference; the callee's module lacks it
        raise errors.FunctionNotOnCalleeError(
            f"{name!r} cannot be loaded here: {err}. The RPC pickler does not serialize the function code "
            "of a function its module defines, only its name: define or import the same function on the "
            "callee") from err
    return fn.resolve() if isinstance(fn, _MainReference) else fn
