"""torchrpc: remote procedure calls for PyTorch, TorchScript-first.

The API of ``torch.distributed.rpc``: switch with ``import torchrpc as rpc``.
"""

from torchrpc import autograd, functions, optim
from torchrpc.api import (
    WorkerInfo,
    _debug_info,
    _get_current_rpc_agent,
    get_rpc_timeout,
    get_worker_info,
    init_rpc,
    is_available,
    register,
    remote,
    rpc_async,
    rpc_sync,
    shutdown,
)
from torchrpc.errors import (
    CalleePolicyError,
    FunctionNotOnCalleeError,
    InvalidWorkerNameError,
    NotInitializedError,
    PeerUnreachableError,
    RemoteError,
    RpcError,
    RpcTimeoutError,
    ScriptArgumentError,
    ShutdownError,
    UnknownFunctionError,
    UnknownWorkerError,
)
from torchrpc.options import BackendType, RpcBackendOptions, RpcOptions
from torchrpc.rref import RRef
from torchrpc import nn  # noqa: E402 (after the API it builds on)
from torchrpc.profiler import _server_process_global_profile
from torchrpc import torch_backend  # noqa: E402,F401  (registers torch.distributed.rpc's TORCHRPC backend)

#: torch.distributed.rpc's names for the options, so that its programs run
#: unchanged (device maps must stay empty: torchrpc sends CPU tensors only).
TensorPipeRpcBackendOptions = RpcOptions
__all__ = [
    "BackendType",
    "CalleePolicyError",
    "FunctionNotOnCalleeError",
    "InvalidWorkerNameError",
    "NotInitializedError",
    "PeerUnreachableError",
    "RRef",
    "RemoteError",
    "RpcBackendOptions",
    "RpcError",
    "RpcOptions",
    "RpcTimeoutError",
    "ScriptArgumentError",
    "ShutdownError",
    "TensorPipeRpcBackendOptions",
    "UnknownFunctionError",
    "UnknownWorkerError",
    "WorkerInfo",
    "autograd",
    "functions",
    "get_rpc_timeout",
    "get_worker_info",
    "init_rpc",
    "is_available",
    "nn",
    "optim",
    "register",
    "remote",
    "rpc_async",
    "rpc_sync",
    "shutdown",
]
