"""How a function of the caller's __main__ travels (torchrpc/callables.py)."""

import sys
import threading
import types

import pytest

from torchrpc import callables, errors


def _main_function(name, source, **globals_):
    """A function defined in this process's __main__ (as a script's are)."""
    namespace = {"__name__": "__main__", **globals_}
    exec(source, namespace)
    fn = namespace[name]
    setattr(sys.modules["__main__"], name, fn)
    return fn


@pytest.fixture
def main_fn():
    made = []
    yield lambda *a, **k: made.append(_main_function(*a, **k)) or made[-1]
    for fn in made:
        if getattr(sys.modules["__main__"], fn.__name__, None) is fn:
            delattr(sys.modules["__main__"], fn.__name__)


def test_an_unpicklable_main_function_goes_by_name(main_fn):
    fn = main_fn("locked_count", "def locked_count():\n    with LOCK:\n        return 7\n", LOCK=threading.Lock())
    _, data = callables.pickle_function(fn)  # cloudpickle alone fails: a lock
    assert callables.load_function(data, "locked_count") is fn  # the callee's own, by name
    delattr(sys.modules["__main__"], "locked_count")  # a callee running another program
    with pytest.raises(errors.FunctionNotOnCalleeError,
                       match=r"'locked_count' is a function of the caller's __main__.*could not send a copy "
                             r"\(TypeError: cannot pickle '_thread.lock' object\)"):
        callables.load_function(data, "locked_count")


def test_a_picklable_main_function_carries_a_copy_for_other_programs(main_fn):
    fn = main_fn("plus_base", "def plus_base(x):\n    return x + BASE\n", BASE=40)
    _, data = callables.pickle_function(fn)
    delattr(sys.modules["__main__"], "plus_base")
    copy = callables.load_function(data, "plus_base")
    assert isinstance(copy, types.FunctionType) and copy is not fn and copy(2) == 42
