"""Caller side of shipped code (csrc/script_dispatch/shipped_code.h): a
TorchScript function the callee cannot find by name, or an exported program,
is sent as its bytes, once per callee, and called by content hash from then on.

A TorchScript function's bytes are ``ScriptFunction.save_to_buffer()``: the
function and all it calls, compiled on the callee in C++ with no Python source
needed there. An exported program's are its AOTInductor package
(torchrpc/exported.py), which the callee loads in C++.
"""

import hashlib
import threading
import weakref

import torch

from torchrpc import exported

FORMAT = "torchscript-zip/1"  # must match kShippedFormat in shipped_code.h
PACKAGE_FORMAT = "aoti-package/1"  # must match kShippedPackageFormat

_lock = threading.Lock()
_code = weakref.WeakKeyDictionary()  # ScriptFunction or ExportedProgram -> (format, sha1, uint8 tensor)
_shipped_to = weakref.WeakKeyDictionary()  # the same -> ranks that needed its code
_any_shipped = False  # whether _shipped_to was ever filled (cheaper to test than its length)


def _code_of(fn):
    with _lock:
        entry = _code.get(fn)
    if entry is None:
        if exported.is_exported_program(fn):
            with open(exported.package(fn), "rb") as f:
                data, fmt = f.read(), PACKAGE_FORMAT
        else:
            data, fmt = fn.save_to_buffer(), FORMAT
        entry = (fmt, hashlib.sha1(data).hexdigest(), torch.frombuffer(bytearray(data), dtype=torch.uint8))
        with _lock:
            _code[fn] = entry
    return entry


def reference(fn, rank):
    """What a call of fn on `rank` carries: None (call by name) until that
    callee once lacked fn, then (format, sha1, None)."""
    if not _any_shipped:  # the common case: no callee ever lacked a function
        return None
    with _lock:
        if rank not in _shipped_to.get(fn, ()):
            return None
        fmt, digest, _ = _code[fn]
        return (fmt, digest, None)


def by_hash(fn):
    """(format, sha1, None): a call by hash alone, for code that has no name
    the callee could know (an exported program)."""
    fmt, digest, _ = _code_of(fn)
    return (fmt, digest, None)


def shipped(fn, rank):
    """Whether `rank` was sent fn's code already."""
    with _lock:
        return rank in _shipped_to.get(fn, ())


def with_code(fn, rank):
    """The shipped tuple with the code, for a callee that lacks it."""
    global _any_shipped
    entry = _code_of(fn)
    with _lock:
        _shipped_to.setdefault(fn, set()).add(rank)
        _any_shipped = True
    return entry


def forget():
    with _lock:
        _shipped_to.clear()
