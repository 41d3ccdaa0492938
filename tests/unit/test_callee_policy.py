"""The callee policy of a script-only worker as a caller, calling itself:
a Python callable is refused before anything is sent (its result would be
a pickle), TorchScript functions and builtins run. The callee's side, and
refusals of a peer's pickles, are in tests/multiprocess/test_callee_policy.py."""

import pytest
import torch

import torchrpc
from tests.multiprocess.cluster import free_port


@torch.jit.script
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def py_double(x):
    return x * 2


@pytest.fixture(scope="module")
def solo():
    torchrpc.init_rpc("solo", rank=0, world_size=1, rpc_backend_options=torchrpc.RpcOptions(
        init_method=f"tcp://127.0.0.1:{free_port()}", num_worker_threads=2, script_only=True))
    yield
    torchrpc.shutdown()


@pytest.mark.parametrize("call", [torchrpc.rpc_sync, torchrpc.rpc_async, torchrpc.remote])
def test_a_script_only_caller_sends_no_python_callable(solo, call):
    with pytest.raises(torchrpc.CalleePolicyError, match=rf"{call.__name__} of '.*py_double' refused on solo: it is "
                                                         r"not TorchScript.*RpcOptions\(script_only=True\)"):
        call("solo", py_double, args=(torch.ones(1),))
    info = torchrpc.api._debug_info()
    assert (info["pending_requests"], info["user_rrefs"], info["owner_rrefs"]) == (0, 0, 0), "the refused call was sent"


def test_a_script_only_caller_runs_script_functions_and_builtins(solo):
    x = torch.ones(2)
    assert torch.equal(torchrpc.rpc_sync("solo", double, args=(x,)), 2 * x)
    assert torch.equal(torchrpc.rpc_sync("solo", torch.add, args=(x, x)), 2 * x)
