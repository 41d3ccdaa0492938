"""torchrpc: remote procedure calls for PyTorch, TorchScript-first.

The API of ``torch.distributed.rpc``: switch with ``import torchrpc as rpc``.
"""

from torchrpc import autograd, functions, optim
from torchrpc.api import (
    WorkerInfo,
    _debug_info,
    get_worker_info,
    init_rpc,
    register,
    remote,
    rpc_async,
    rpc_sync,
    shutdown,
)
from torchrpc.errors import (
    NotInitializedError,
    PeerUnreachableError,
    RemoteError,
    RpcError,
    RpcTimeoutError,
    ShutdownError,
    UnknownFunctionError,
)
from torchrpc.options import RpcOptions
from torchrpc.rref import RRef

#: Accepted for code written for torch.distributed.rpc.
TensorPipeRpcBackendOptions = RpcOptions

__all__ = [
    "NotInitializedError",
    "PeerUnreachableError",
    "RRef",
    "RemoteError",
    "RpcError",
    "RpcOptions",
    "RpcTimeoutError",
    "ShutdownError",
    "TensorPipeRpcBackendOptions",
    "UnknownFunctionError",
    "WorkerInfo",
    "autograd",
    "functions",
    "get_worker_info",
    "init_rpc",
    "optim",
    "register",
    "remote",
    "rpc_async",
    "rpc_sync",
    "shutdown",
]
