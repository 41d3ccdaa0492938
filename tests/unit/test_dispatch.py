"""The caller's classification of a callee (torchrpc.dispatch.classify) is
kept per function, and follows what register() and async_execution() change
about that function later. No session needed."""

import torch

import torchrpc
from torchrpc import dispatch, state


@torch.jit.script
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@torch.jit.script
def _triple(x: torch.Tensor) -> torch.Tensor:
    return x * 3


def test_a_script_function_is_called_by_the_name_registered_after_its_first_call():
    first = dispatch.classify("rpc_sync", _double)
    assert first.name == _double.qualified_name
    assert dispatch.classify("rpc_sync", _double) is first  # kept
    torchrpc.register("test_dispatch.double", _double)
    try:
        assert dispatch.classify("rpc_sync", _double).name == "test_dispatch.double"
    finally:
        _unregister("test_dispatch.double")


def _unregister(*names):
    for name in names:
        state._script_names.pop(state._registered_scripts.pop(name), None)
    state.callees_changed()


def test_a_name_given_to_another_function_no_longer_sends_the_first():
    torchrpc.register("test_dispatch.f", _double)
    torchrpc.register("test_dispatch.f", _triple)
    try:
        assert dispatch.classify("rpc_sync", _double).name == _double.qualified_name  # not the name that runs _triple
        assert dispatch.classify("rpc_sync", _triple).name == "test_dispatch.f"
        assert ("test_dispatch.f", _triple) in [(name, fn) for fn, name in state.script_names()]
        assert _double not in [fn for fn, _ in state.script_names()]
    finally:
        _unregister("test_dispatch.f")


def test_every_name_of_a_function_registered_twice_is_served():
    torchrpc.register("test_dispatch.a", _double)
    torchrpc.register("test_dispatch.b", _double)
    try:
        served = [(name, fn) for fn, name in state.script_names()]
        assert ("test_dispatch.a", _double) in served and ("test_dispatch.b", _double) in served
        assert dispatch.classify("rpc_sync", _double).name == "test_dispatch.b"  # the last name given
    finally:
        _unregister("test_dispatch.a", "test_dispatch.b")


def test_async_execution_marked_after_a_call_is_seen_by_the_next():
    assert dispatch.classify("rpc_async", _triple).is_async is False
    torchrpc.functions.async_execution(_triple)
    try:
        assert dispatch.classify("rpc_async", _triple).is_async is True
    finally:
        delattr(_triple, torchrpc.functions._MARK)
        state.callees_changed()


def test_functions_are_told_apart_by_identity_and_python_callables_are_not_kept():
    assert dispatch.classify("rpc_sync", _double).target is _double
    assert dispatch.classify("rpc_sync", _triple).target is _triple
    assert dispatch.classify("rpc_sync", torch.add).target == "aten::add"

    def plain(x):
        return x

    # A Python callee keeps per-call state (whether the callee has its pickle yet).
    assert dispatch.classify("rpc_sync", plain) is not dispatch.classify("rpc_sync", plain)


def test_the_cache_is_bounded():
    for _ in range(dispatch._MAX_CLASSIFIED + 10):
        fn = torch.jit.CompilationUnit("def f(x: Tensor) -> Tensor:\n    return x + 1\n").f  # a new one each time
        dispatch.classify("rpc_sync", fn)
    assert len(dispatch._classified) <= dispatch._MAX_CLASSIFIED
