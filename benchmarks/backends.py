"""The two RPC implementations under test, behind one tiny interface.

``load(name)`` returns a :class:`Backend`: the module used as ``rpc`` (torchrpc,
or torch.distributed.rpc) and how to build its options. Everything else in the
benchmarks is written once against ``backend.rpc``.
"""

import importlib

#: Backend names, in the order they are run and reported.
NAMES = ("torch", "torchrpc")

#: Human-readable labels for the report.
LABELS = {"torch": "torch.distributed.rpc", "torchrpc": "torchrpc"}


class Backend:
    """One RPC implementation.

    Attributes:
        name (str): "torch" or "torchrpc".
        rpc (module): the module with init_rpc, rpc_sync, rpc_async, shutdown.
        autograd (module): distributed autograd (context, backward, get_gradients).
        optim (module): the module with DistributedOptimizer.
    """

    def __init__(self, name, rpc, transports=None):
        self.name = name
        self.rpc = rpc
        self._transports = transports
        # distributed autograd and DistributedOptimizer's module
        if name == "torchrpc":
            self.autograd, self.optim = rpc.autograd, rpc.optim
        else:
            self.autograd = importlib.import_module("torch.distributed.autograd")
            self.optim = importlib.import_module("torch.distributed.optim")

    def options(self, port, num_worker_threads, rpc_timeout):
        """Backend options for a job whose rendezvous is tcp://127.0.0.1:<port>."""
        init_method = f"tcp://127.0.0.1:{port}"
        if self.name == "torchrpc":
            return self.rpc.RpcOptions(num_worker_threads=num_worker_threads,
                                       rpc_timeout=rpc_timeout, init_method=init_method)
        extra = {"_transports": list(self._transports)} if self._transports else {}
        return self.rpc.TensorPipeRpcBackendOptions(num_worker_threads=num_worker_threads,
                                                    rpc_timeout=rpc_timeout,
                                                    init_method=init_method, **extra)


def load(name, transports=None):
    """Imports backend `name` ("torch" or "torchrpc").

    Args:
        name (str): which implementation.
        transports (list of str): TensorPipe transports for "torch" (e.g. ["uv"]);
            None keeps TensorPipe's default choice. Ignored for torchrpc.
    """
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(NAMES)}")
    module = "torchrpc" if name == "torchrpc" else "torch.distributed.rpc"
    return Backend(name, importlib.import_module(module), transports)
