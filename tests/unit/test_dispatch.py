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
        state._script_names.pop(_double, None)
        state.callees_changed()


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
