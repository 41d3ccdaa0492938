"""Caller side of shipped code (csrc/script_dispatch/shipped_code.h): a
TorchScript function the callee cannot find by name is sent as its
TorchScript bytes, once per callee, and called by content hash from then on.

The bytes are ``ScriptFunction.save_to_buffer()``: the function and all it
calls, compiled on the callee in C++ with no Python source needed there.
"""

import hashlib
import threading
import weakref

import torch

FORMAT = "torchscript-zip/1"  # must match kShippedFormat in shipped_code.h

_lock = threading.Lock()
_code = weakref.WeakKeyDictionary()  # ScriptFunction -> (sha1, uint8 tensor)
_shipped_to = weakref.WeakKeyDictionary()  # ScriptFunction -> ranks that needed its code


def _code_of(fn):
    with _lock:
        entry = _code.get(fn)
    if entry is None:
        data = fn.save_to_buffer()
        entry = (hashlib.sha1(data).hexdigest(), torch.frombuffer(bytearray(data), dtype=torch.uint8))
        with _lock:
            _code[fn] = entry
    return entry


def reference(fn, rank):
    """What a call of fn on `rank` carries: None (call by name) until that
    callee once lacked fn, then (format, sha1, None)."""
    if not _shipped_to:  # the common case: no callee ever lacked a function
        return None
    with _lock:
        if rank not in _shipped_to.get(fn, ()):
            return None
        return (FORMAT, _code[fn][0], None)


def with_code(fn, rank):
    """The shipped tuple with the code, for a callee that lacks it."""
    digest, code = _code_of(fn)
    with _lock:
        _shipped_to.setdefault(fn, set()).add(rank)
    return (FORMAT, digest, code)


def forget():
    with _lock:
        _shipped_to.clear()
