"""RpcOptions: how a worker joins the job and serves calls (and the backend
names of ``torch.distributed.rpc``, so that its programs run unchanged)."""

import datetime
import enum
import numbers
import os

from torchrpc import constants


class RpcBackendOptions:
    """The base of every backend's options, as in ``torch.distributed.rpc``:
    ``rpc_timeout`` and ``init_method``. It names no backend: init_rpc takes
    an instance of it only with ``backend=`` given; pass :class:`RpcOptions`
    (alias ``TensorPipeRpcBackendOptions``) instead."""

    def __init__(self, rpc_timeout=constants.DEFAULT_RPC_TIMEOUT_SEC, init_method=constants.DEFAULT_INIT_METHOD):
        self.rpc_timeout = _seconds("rpc_timeout", rpc_timeout)
        self.init_method = init_method


class RpcOptions(RpcBackendOptions):
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
            (default 1800, torch's rendezvous timeout).
        secret (bytes or str): the job's secret. Every connection starts with
            a handshake in which both ends prove they hold it, so no process
            without it can send a worker anything. Give every worker the same
            one, or none (the default, also from ``TORCHRPC_SECRET``): then
            rank 0 makes a random one and hands it out through the
            rendezvous store, so whoever can read that store can join. See
            docs/threat-model.md.
        max_message_bytes (int): the largest message, payload and tensors
            together, this worker sends or accepts (default 16 GiB). A
            larger one fails its call with ValueError on the sender; a peer
            that sends one anyway is disconnected before anything is
            allocated for it.
        max_peer_bytes (int): bytes of requests from one peer this worker
            holds, running or waiting, before it stops reading from that
            peer until some are answered (default 4 GiB; one message larger
            than it is still taken, alone).
        max_calls_in_flight (int): requests from one peer that run at once
            (default 256); later ones wait their turn, in order (up to 64
            times as many; beyond that the worker stops reading). Together
            with ``max_peer_bytes`` it bounds what a peer that floods
            requests, or never reads its responses, can make this worker hold.
        heartbeat_timeout (float): seconds without any sign of life from a
            peer that owes this worker responses, after which its calls fail
            with an error naming it (default 30, or TORCHRPC_HEARTBEAT_SECONDS;
            ``0`` turns heartbeats off). It detects a stopped (SIGSTOP), hung
            or partitioned peer even for calls without a timeout; a peer that
            is merely busy answers heartbeats from its I/O thread.
        script_only (bool): run no pickle, either way (default False). As a
            callee, this worker refuses every request it would unpickle or
            run Python for (Python callables, their ``remote()``, methods of
            an RRef's Python value); as a caller, it refuses to send a Python
            callable and refuses a pickled result (``PYTHON_RET``) from any
            peer. TorchScript functions and builtins keep working.
        allowed_callables (iterable of str): the only callables peers may run
            here, by name: builtins by operator (``"aten::add"``, every
            overload; ``"aten::add.Tensor"``, that one), TorchScript functions
            by the name they are called by (``torchrpc.register``'s, or the
            qualified name), Python functions by ``"module.qualname"`` and
            methods of an RRef's Python value by ``"module.Class.method"``.
            Setting it also refuses shipped code (its code is the caller's,
            whatever its name). ``None`` (default) allows everything. A
            Python call's arguments are unpickled before its name is
            checked: only ``script_only`` keeps a peer's pickle from running.
        allow_import_by_name (bool): whether a TorchScript call naming a
            function nobody registered here is resolved by its qualified
            name, importing its module (default True). If False, only
            functions given to ``torchrpc.register`` (and shipped code) run.
        allow_shipped_code (bool): whether TorchScript code a caller sends
            (for a function this worker lacks), and the AOTInductor package
            of an exported program a caller calls directly, is compiled or
            loaded and run here (default True).
        device_maps, devices: ``TensorPipeRpcBackendOptions``' CUDA device
            maps. torchrpc sends CPU tensors only: ``None`` or empty, else
            ValueError.
        _transports, _channels: ``TensorPipeRpcBackendOptions``' TensorPipe
            tuning; accepted and ignored (torchrpc picks a Unix socket or TCP
            itself).

    Example::

        >>> import torchrpc
        >>> opts = torchrpc.RpcOptions(num_worker_threads=8, rpc_timeout=20)
        >>> opts.rpc_timeout
        20.0
        >>> strict = torchrpc.RpcOptions(script_only=True, allowed_callables=["aten::add", "my.score"])
        >>> sorted(strict.allowed_callables)
        ['aten::add', 'my.score']
    """

    _FIELDS = ("num_worker_threads", "rpc_timeout", "init_method", "store", "init_timeout", "max_message_bytes",
               "max_peer_bytes", "max_calls_in_flight", "heartbeat_timeout", "script_only", "allowed_callables",
               "allow_import_by_name", "allow_shipped_code")

    def __init__(
        self,
        *,
        num_worker_threads=constants.DEFAULT_NUM_WORKER_THREADS,
        rpc_timeout=constants.DEFAULT_RPC_TIMEOUT_SEC,
        init_method=constants.DEFAULT_INIT_METHOD,
        store=None,
        init_timeout=constants.DEFAULT_INIT_TIMEOUT_SEC,
        secret=None,
        max_message_bytes=constants.DEFAULT_MAX_MESSAGE_BYTES,
        max_peer_bytes=constants.DEFAULT_MAX_PEER_BYTES,
        max_calls_in_flight=constants.DEFAULT_MAX_CALLS_IN_FLIGHT,
        heartbeat_timeout=None,
        script_only=False,
        allowed_callables=None,
        allow_import_by_name=True,
        allow_shipped_code=True,
        device_maps=None,
        devices=None,
        _transports=None,
        _channels=None,
    ):
        self.num_worker_threads = _positive_int("num_worker_threads", num_worker_threads)
        self.max_message_bytes = _positive_int("max_message_bytes", max_message_bytes)
        self.max_peer_bytes = _positive_int("max_peer_bytes", max_peer_bytes)
        self.max_calls_in_flight = _positive_int("max_calls_in_flight", max_calls_in_flight)
        if heartbeat_timeout is None:
            heartbeat_timeout = float(os.environ.get("TORCHRPC_HEARTBEAT_SECONDS",
                                                     constants.DEFAULT_HEARTBEAT_TIMEOUT_SEC))
        self.heartbeat_timeout = _seconds("heartbeat_timeout", heartbeat_timeout)
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
        if isinstance(secret, str):
            secret = secret.encode()
        if secret is not None and not isinstance(secret, (bytes, bytearray)):
            raise TypeError(f"RpcOptions(secret=...) expects bytes or a str; got {type(secret).__name__}")
        if secret is not None and len(secret) < 16:
            raise ValueError(f"RpcOptions(secret=...) needs at least 16 bytes; got {len(secret)}")
        self.secret = bytes(secret) if secret is not None else None
        self.script_only = _flag("script_only", script_only)
        self.allowed_callables = _callable_names(allowed_callables)
        self.allow_import_by_name = _flag("allow_import_by_name", allow_import_by_name)
        self.allow_shipped_code = _flag("allow_shipped_code", allow_shipped_code)
        self.device_maps = _cpu_only(f"RpcOptions(device_maps={device_maps!r})", device_maps, dict)
        self.devices = _cpu_only(f"RpcOptions(devices={devices!r})", devices, list)
        for name, value in (("_transports", _transports), ("_channels", _channels)):
            if value is not None and not isinstance(value, (list, tuple)):
                raise TypeError(f"RpcOptions({name}=...) expects a list; got {type(value).__name__}")

    def set_device_map(self, to, device_map):
        """``TensorPipeRpcBackendOptions.set_device_map``: only an empty map is
        accepted (torchrpc sends CPU tensors only)."""
        _cpu_only(f"RpcOptions.set_device_map({to!r}, {device_map!r})", device_map, dict)

    def set_devices(self, devices):
        """``TensorPipeRpcBackendOptions.set_devices``: only an empty list is
        accepted (torchrpc sends CPU tensors only)."""
        _cpu_only(f"RpcOptions.set_devices({devices!r})", devices, list)

    def __repr__(self):
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._FIELDS if f != "store")
        return f"RpcOptions({fields})"

    def callee_policy(self):
        """The policy as the native Worker takes it: (script_only,
        allowed_callables as a sorted list or None, allow_import_by_name,
        allow_shipped_code)."""
        allowed = None if self.allowed_callables is None else sorted(self.allowed_callables)
        return (self.script_only, allowed, self.allow_import_by_name, self.allow_shipped_code)

    @classmethod
    def coerce(cls, options, backend=None):
        """Returns RpcOptions for None, an RpcOptions, or an upstream options
        object; refuses our base RpcBackendOptions, which names no backend."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if isinstance(options, RpcBackendOptions):  # the base class names no backend's options
            why = (f"Could not infer backend for options {type(options).__name__}" if backend is None else
                   f"`rpc_backend_options` must be a `TensorPipeRpcBackendOptions`; got {type(options).__name__}")
            raise TypeError(f"{why}: init_rpc(rpc_backend_options=...) takes torchrpc.RpcOptions (alias "
                            "TensorPipeRpcBackendOptions)")
        known = {f: getattr(options, f) for f in ("num_worker_threads", "rpc_timeout", "init_method",
                                                  "device_maps", "devices")
                 if hasattr(options, f)}
        if not known or isinstance(options, dict):
            raise TypeError(
                "init_rpc(rpc_backend_options=...): Argument rpc_backend_options must be an instance of "
                f"RpcBackendOptions (torchrpc.RpcOptions); got {type(options).__name__}"
            )
        return cls(**known)


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"RpcOptions({name}=...) expects an int; got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"RpcOptions({name}=...) must be at least 1; got {value}")
    return int(value)


def _seconds(name, value):
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"RpcOptions({name}=...) expects seconds as a number; got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"RpcOptions({name}=...) must be >= 0 (0 means no timeout); got {value}")
    return float(value)


def _flag(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"RpcOptions({name}=...) expects True or False; got {type(value).__name__}")
    return value


def _callable_names(names):
    """allowed_callables as a frozenset of names, or None."""
    if names is None:
        return None
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise TypeError(
            "RpcOptions(allowed_callables=...) expects a list of names (str), e.g. ['aten::add', 'mymodule.f'], "
            f"or None; got {type(names).__name__}"
        )
    names = list(names)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"RpcOptions(allowed_callables=...) expects names (str); got {type(name).__name__} {name!r}")
        if not name or name != name.strip():
            raise ValueError(f"RpcOptions(allowed_callables=...): {name!r} is not a name (empty, or with spaces around)")
    return frozenset(names)


def _cpu_only(call, value, kind):
    """An empty `kind` (dict: a device map, or list: devices) for None or an
    empty value; else the error of `call`, which asked for CUDA devices."""
    if value is None:
        return kind()
    if not isinstance(value, (dict,) if kind is dict else (list, tuple)):
        raise TypeError(f"{call}: expects a {kind.__name__}; got {type(value).__name__}")
    if len(value) == 0:
        return kind()
    raise ValueError(
        f"{call}: torchrpc sends CPU tensors only, so it maps no CUDA devices. Move tensors "
        "to the CPU (tensor.cpu()) before sending them, and set no device_maps or devices."
    )


class BackendType(enum.Enum):
    """The RPC backend, as in ``init_rpc(..., backend=BackendType.TENSORPIPE)``.

    torchrpc has one backend, its own transport; ``TENSORPIPE`` (the only
    backend ``torch.distributed.rpc`` still has) selects it, so that programs
    written for ``torch.distributed.rpc`` run unchanged.
    """

    TENSORPIPE = "TENSORPIPE"


def check_backend(backend):
    """Accepts None, BackendType.TENSORPIPE and torch.distributed.rpc's
    BackendType.TENSORPIPE; anything else is a TypeError."""
    if backend is None or backend is BackendType.TENSORPIPE:
        return
    if isinstance(backend, enum.Enum) and type(backend).__name__ == "BackendType" and backend.name == "TENSORPIPE":
        return
    raise TypeError(
        f"init_rpc(backend={backend!r}): Argument backend must be a member of BackendType; torchrpc has "
        "one backend: pass torchrpc.BackendType.TENSORPIPE or leave backend unset."
    )
