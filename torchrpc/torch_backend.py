"""The TORCHRPC backend of ``torch.distributed.rpc``: upstream's own API, RRefs,
distributed autograd, profiler and TorchScript support, over torchrpc's
transport. ``import torchrpc`` registers it; a program then changes one
argument::

    import torchrpc  # noqa: F401  (registers the backend)
    import torch.distributed.rpc as rpc

    rpc.init_rpc("worker0", rank=0, world_size=2, backend=rpc.BackendType.TORCHRPC)

The agent is C++ (csrc/torch_backend/torch_agent.h); this module gives it
upstream's registry entry: an options class and the handler that builds the
agent from the store, name, rank and world size upstream's ``init_rpc``
passes. See docs/torch-backend.md for what works and when to choose it.
"""

import functools
import numbers

import torch
import torch.distributed as dist
import torch.distributed.rpc as _rpc
from torch.distributed.rpc import api as _api
from torch.distributed.rpc import backend_registry as _registry

from torchrpc import constants, rendezvous
from torchrpc._extension import native

BACKEND_NAME = "TORCHRPC"


class TorchRpcBackendOptions(_rpc.RpcBackendOptions):
    """Options of the TORCHRPC backend, in the order and with the defaults of
    ``TensorPipeRpcBackendOptions`` (an instance of that class is accepted
    too).

    Args:
        num_worker_threads (int): threads that run incoming requests
            (default 16).
        rpc_timeout (float): default timeout of a call, in seconds (default
            60); ``0`` means no timeout.
        init_method (str): how workers find each other (default ``"env://"``,
            as set by ``torchrun``; also ``"tcp://host:port"``,
            ``"file:///path"``).
        device_maps, devices: must stay empty: the backend sends CPU tensors
            only.
        _transports, _channels: TensorPipe's; ignored (torchrpc picks Unix
            sockets on one host and TCP between hosts itself).

    Raises:
        TypeError, ValueError: a bad value, naming it.
    """

    def __init__(self, num_worker_threads=constants.DEFAULT_NUM_WORKER_THREADS,
                 rpc_timeout=constants.DEFAULT_RPC_TIMEOUT_SEC, init_method=constants.DEFAULT_INIT_METHOD,
                 device_maps=None, devices=None, _transports=None, _channels=None):
        if not isinstance(rpc_timeout, numbers.Real) or isinstance(rpc_timeout, bool) or rpc_timeout < 0:
            raise ValueError(f"TorchRpcBackendOptions(rpc_timeout={rpc_timeout!r}): expected seconds >= 0 "
                             "(0 means no timeout)")
        super().__init__(float(rpc_timeout), init_method)
        if (not isinstance(num_worker_threads, numbers.Integral) or isinstance(num_worker_threads, bool)
                or num_worker_threads < 1):
            raise ValueError(f"TorchRpcBackendOptions(num_worker_threads={num_worker_threads!r}): expected an "
                             "int >= 1")
        _check_cpu_only("TorchRpcBackendOptions", device_maps, devices)
        self.num_worker_threads = int(num_worker_threads)
        self.device_maps = {}
        self.devices = []

    def set_device_map(self, to, device_map):
        """Refused: the TORCHRPC backend sends CPU tensors only."""
        _check_cpu_only("TorchRpcBackendOptions.set_device_map", {to: device_map}, None)

    def set_devices(self, devices):
        """Refused: the TORCHRPC backend sends CPU tensors only."""
        _check_cpu_only("TorchRpcBackendOptions.set_devices", None, devices)


def _check_cpu_only(where, device_maps, devices):
    if device_maps or devices:
        raise ValueError(f"{where}: the TORCHRPC backend sends CPU tensors only, so device maps and devices must "
                         "stay empty; use BackendType.TENSORPIPE for CUDA tensors")


def _construct_options(rpc_timeout, init_method, num_worker_threads=constants.DEFAULT_NUM_WORKER_THREADS,
                       **kwargs):
    # upstream's construct_rpc_backend_options(backend, rpc_timeout, init_method, **kwargs)
    return TorchRpcBackendOptions(num_worker_threads=num_worker_threads, rpc_timeout=rpc_timeout,
                                  init_method=init_method, **kwargs)


def _agent_options(name, rank, world_size, options):
    """The native AgentOptions of this worker, from our options or TensorPipe's."""
    if not isinstance(options, (TorchRpcBackendOptions, _rpc.TensorPipeRpcBackendOptions)):
        raise TypeError(f"the TORCHRPC backend takes TorchRpcBackendOptions (or TensorPipeRpcBackendOptions) as "
                        f"rpc_backend_options; got {type(options).__name__}")
    _check_cpu_only(f"init_rpc({name!r}, backend=TORCHRPC)", options.device_maps, options.devices)
    o = native().AgentOptions()
    o.name, o.rank, o.world_size = name, rank, world_size
    o.num_worker_threads, o.rpc_timeout = options.num_worker_threads, options.rpc_timeout
    o.listen_host = rendezvous.listen_host(options.init_method)
    o.host_id = rendezvous.host_id()
    o.options_type = type(options).__name__  # errors name the options the user set
    return o


def _init_backend(store, name, rank, world_size, rpc_backend_options):
    # upstream's init_backend(backend, store=, name=, rank=, world_size=, rpc_backend_options=)
    if not isinstance(store, dist.Store):
        raise TypeError(f"the TORCHRPC backend needs a torch.distributed.Store; got {type(store).__name__}")
    # No world_size: a dynamic job, whose workers join and leave while it runs.
    agent = native().TorchBackendAgent(store, _agent_options(name, rank, world_size or 0, rpc_backend_options))
    _api._init_rpc_states(agent)  # upstream's: sets the current agent, its RRef context, and starts it
    return agent


def _backend_agent():
    """The current agent if it is this backend's, else None."""
    agent = _api._get_current_rpc_agent() if _api._is_current_rpc_agent_set() else None
    return agent if isinstance(agent, native().TorchBackendAgent) else None


def _wait_all_workers(*args, **kwargs):
    # Upstream's graceful shutdown meets every worker first, except on a
    # dynamic TensorPipe agent. A dynamic TORCHRPC worker leaves on its own
    # too (its agent's join tells the members), so it meets no one: the
    # others may go on running.
    agent = _backend_agent()
    if agent is not None and not agent.is_static_group:
        return None
    return _upstream_wait_all_workers(*args, **kwargs)


_upstream_wait_all_workers = _api._wait_all_workers
_upstream_rpc_sync = _api.rpc_sync


@functools.wraps(_upstream_rpc_sync)
def _rpc_sync(to, func, args=None, kwargs=None, timeout=_api.UNSET_RPC_TIMEOUT):
    # Upstream's rpc_sync, but on this backend the calling thread waits for
    # the call itself: it polls before it sleeps and completes the call's
    # future when the response comes (TorchBackendSyncWait), instead of
    # sleeping in the future's wait until a pool thread completes it and
    # wakes it. Ctrl-C ends the wait. Other backends: upstream's, unchanged.
    agent = _backend_agent()
    if agent is None:
        return _upstream_rpc_sync(to, func, args, kwargs, timeout)
    torch._C._log_api_usage_once("torch.distributed.rpc_sync")
    wait = native().TorchBackendSyncWait(agent)  # this thread's next send is the call
    try:
        fut = _api._invoke_rpc(to, func, _api.RPCExecMode.SYNC, args, kwargs, timeout)
        wait.wait()
    finally:
        wait.close()
    return fut.wait()


def register():
    """Registers the backend with torch.distributed.rpc (once per process)."""
    if not _registry.backend_registered(BACKEND_NAME):
        _registry.register_backend(BACKEND_NAME, _construct_options, _init_backend)
        _api._wait_all_workers = _wait_all_workers  # shutdown() looks it up in api at call time
        _api.rpc_sync = _rpc.rpc_sync = _rpc_sync  # programs call rpc.rpc_sync: looked up at call time
    # register_backend makes a new BackendType enum; torch.distributed.rpc's
    # own name must be that one, or its init_rpc refuses its default backend.
    _rpc.BackendType = _registry.BackendType


register()
