"""RpcOptions: how a worker joins the job and serves calls."""

import datetime
import numbers

from torchrpc import constants


class RpcOptions:
    """Options for :func:`torchrpc.init_rpc`, validated on construction.

    Keyword-only. Passed as ``rpc_backend_options``; options objects of
    ``torch.distributed.rpc`` (e.g. ``TensorPipeRpcBackendOptions``) are
    accepted too, and their ``num_worker_threads``, ``rpc_timeout`` and
    ``init_method`` are used.

    Args:
        num_worker_threads (int): threads that run incoming calls on this worker
            (default 16). TorchScript and builtin calls run in parallel on them
            without the GIL; Python calls take turns on the GIL.
        rpc_timeout (float): default timeout of a call, in seconds (default 60).
            ``0`` means no timeout.
        init_method (str): how workers find each other: ``"env://"`` (default;
            MASTER_ADDR, MASTER_PORT, and RANK/WORLD_SIZE if not given, as set by
            ``torchrun``), ``"tcp://host:port"`` or ``"file:///path"``.
        store (torch.distributed.Store): an existing store to rendezvous through
            instead of ``init_method``.
        init_timeout (float): seconds init_rpc waits for the whole job
            (default 300).

    Example::

        >>> import torchrpc
        >>> opts = torchrpc.RpcOptions(num_worker_threads=8, rpc_timeout=20)
        >>> opts.rpc_timeout
        20.0
    """

    _FIELDS = ("num_worker_threads", "rpc_timeout", "init_method", "store", "init_timeout")

    def __init__(
        self,
        *,
        num_worker_threads=constants.DEFAULT_NUM_WORKER_THREADS,
        rpc_timeout=constants.DEFAULT_RPC_TIMEOUT_SEC,
        init_method=constants.DEFAULT_INIT_METHOD,
        store=None,
        init_timeout=constants.DEFAULT_INIT_TIMEOUT_SEC,
    ):
        if isinstance(num_worker_threads, bool) or not isinstance(num_worker_threads, numbers.Integral):
            raise TypeError(
                f"RpcOptions(num_worker_threads=...) expects an int; got {type(num_worker_threads).__name__}"
            )
        if num_worker_threads < 1:
            raise ValueError(f"RpcOptions(num_worker_threads=...) must be at least 1; got {num_worker_threads}")
        self.num_worker_threads = int(num_worker_threads)
        self.rpc_timeout = _seconds("rpc_timeout", rpc_timeout)
        self.init_timeout = _seconds("init_timeout", init_timeout)
        if not isinstance(init_method, str):
            raise TypeError(f"RpcOptions(init_method=...) expects a str; got {type(init_method).__name__}")
        if not init_method.startswith(("env://", "tcp://", "file://")):
            raise ValueError(
                f"RpcOptions(init_method={init_method!r}): expected 'env://', 'tcp://host:port' "
                "or 'file:///path'"
            )
        self.init_method = init_method
        if store is not None:
            import torch.distributed as dist

            if not isinstance(store, dist.Store):
                raise TypeError(
                    f"RpcOptions(store=...) expects a torch.distributed.Store; got {type(store).__name__}"
                )
        self.store = store

    def __repr__(self):
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._FIELDS if f != "store")
        return f"RpcOptions({fields})"

    @classmethod
    def coerce(cls, options):
        """Returns RpcOptions for None, an RpcOptions, or an upstream options object."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        known = {f: getattr(options, f) for f in ("num_worker_threads", "rpc_timeout", "init_method")
                 if hasattr(options, f)}
        if not known:
            raise TypeError(
                "init_rpc(rpc_backend_options=...) expects torchrpc.RpcOptions; got "
                f"{type(options).__name__}"
            )
        return cls(**known)


def _seconds(name, value):
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"RpcOptions({name}=...) expects seconds as a number; got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"RpcOptions({name}=...) must be >= 0 (0 means no timeout); got {value}")
    return float(value)
