"""The RPC implementations under test, behind one tiny interface.

``load(name)`` returns a :class:`Backend`: the module used as ``rpc`` (torchrpc,
or torch.distributed.rpc) and how to call its ``init_rpc``. Everything else in
the benchmarks is written once against ``backend.rpc``. "torch" and "backend"
run the same torch.distributed.rpc program; only the agent under it differs
(TensorPipe, or torchrpc's TORCHRPC backend: docs/torch-backend.md).
"""

import importlib

#: Backend names, in the order they are run and reported.
NAMES = ("torch", "torchrpc", "backend")

#: Human-readable labels for the report.
LABELS = {"torch": "torch.distributed.rpc", "torchrpc": "torchrpc",
          "backend": "TORCHRPC backend"}

#: Jobs (run_all's result keys) a backend runs, where not every job: the
#: TORCHRPC backend's rows are those issue #23 asks for.
JOBS = {"backend": ("main", "training")}
#: Jobs only torchrpc runs: torch.distributed.rpc has no equivalent (exported
#: programs as callees).
TORCHRPC_ONLY = ("exported",)


def runs(name, job):
    """Whether backend `name` runs job `job` (a run_all result key)."""
    if job in TORCHRPC_ONLY:
        return name == "torchrpc"
    return job in JOBS.get(name, (job,))


class Backend:
    """One RPC implementation.

    Attributes:
        name (str): a key of NAMES.
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

    def init_kwargs(self, port, num_worker_threads, rpc_timeout):
        """Keyword arguments of ``rpc.init_rpc`` (the backend and its options)
        for a job whose rendezvous is tcp://127.0.0.1:<port>."""
        init_method = f"tcp://127.0.0.1:{port}"
        if self.name == "torchrpc":
            return {"rpc_backend_options": self.rpc.RpcOptions(
                num_worker_threads=num_worker_threads, rpc_timeout=rpc_timeout, init_method=init_method)}
        if self.name == "backend":
            kind = self.rpc.BackendType.TORCHRPC
            return {"backend": kind, "rpc_backend_options": self.rpc.backend_registry.construct_rpc_backend_options(
                kind, init_method=init_method, num_worker_threads=num_worker_threads, rpc_timeout=rpc_timeout)}
        extra = {"_transports": list(self._transports)} if self._transports else {}
        return {"rpc_backend_options": self.rpc.TensorPipeRpcBackendOptions(
            num_worker_threads=num_worker_threads, rpc_timeout=rpc_timeout, init_method=init_method, **extra)}


def load(name, transports=None):
    """Imports backend `name` (a key of NAMES).

    Args:
        name (str): which implementation.
        transports (list of str): TensorPipe transports for "torch" (e.g. ["uv"]);
            None keeps TensorPipe's default choice. Ignored by the others.
    """
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(NAMES)}")
    if name == "backend":
        importlib.import_module("torchrpc")  # registers rpc.BackendType.TORCHRPC
    module = "torchrpc" if name == "torchrpc" else "torch.distributed.rpc"
    return Backend(name, importlib.import_module(module), transports)
