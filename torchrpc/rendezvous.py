"""Rendezvous: workers find each other through a torch.distributed Store.

Each worker publishes (name, rank, TCP address, Unix address, host id) under
``torchrpc/<generation>/worker/<rank>`` and reads everyone else's. The
generation makes a reused store (a ``file://`` path, or the same store passed
twice) safe across init_rpc/shutdown cycles. The same store carries the
shutdown barrier.
"""

import datetime
import os
import pickle
import re
import socket
import urllib.parse

import torch.distributed as dist

from torchrpc import constants

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def validate_name(name):
    """Raises TypeError/ValueError if `name` cannot name a worker."""
    if not isinstance(name, str):
        raise TypeError(f"init_rpc(name=...) expects a str; got {type(name).__name__}")
    if not name or len(name) >= constants.MAX_NAME_LENGTH or not _NAME_RE.match(name):
        raise ValueError(
            f"invalid worker name {name!r}: use letters, digits, '_' and '-', "
            f"fewer than {constants.MAX_NAME_LENGTH} characters"
        )


def host_id():
    """Identifies this host and network namespace: workers with equal ids talk
    over Unix sockets (abstract names are per network namespace)."""
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id",):
        try:
            with open(path) as f:
                parts.append(f.read().strip())
        except OSError:
            pass
    try:
        parts.append(os.readlink("/proc/self/ns/net"))
    except OSError:
        pass
    return "|".join(parts)


def _master_host(init_method):
    if init_method.startswith("tcp://"):
        return urllib.parse.urlparse(init_method).hostname
    if init_method.startswith("env://"):
        return os.environ.get("MASTER_ADDR")
    return None


def listen_host(init_method):
    """The interface to accept TCP connections on: TORCHRPC_LISTEN_ADDR if set,
    loopback when the job's master is on loopback, else the address this host
    uses to reach the master."""
    override = os.environ.get("TORCHRPC_LISTEN_ADDR")
    if override:
        return override
    master = _master_host(init_method)
    if not master or master in ("localhost",) or master.startswith("127.") or master == "::1":
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))  # no packet is sent for UDP connect
            return s.getsockname()[0]
    except OSError:
        return "0.0.0.0"


def open_store(options, rank, world_size):
    """Returns (store, rank, world_size), resolving -1/None from the environment."""
    timeout = datetime.timedelta(seconds=options.init_timeout or 1e6)
    if options.store is not None:
        if rank is None or rank < 0 or world_size is None:
            raise ValueError("init_rpc with an explicit store needs rank= and world_size=")
        return options.store, rank, world_size
    method = options.init_method
    if method.startswith("env://"):
        rank = int(os.environ["RANK"]) if (rank is None or rank < 0) and "RANK" in os.environ else rank
        if world_size is None and "WORLD_SIZE" in os.environ:
            world_size = int(os.environ["WORLD_SIZE"])
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise ValueError(
                f"init_method='env://' needs the environment variables {', '.join(missing)} "
                "(torchrun sets them), or pass RpcOptions(init_method='tcp://host:port')"
            )
    if rank is None or rank < 0:
        raise ValueError("init_rpc needs rank= (or RANK in the environment with env://)")
    if world_size is None or world_size < 1:
        raise ValueError("init_rpc needs world_size= >= 1 (or WORLD_SIZE in the environment with env://)")
    if rank >= world_size:
        raise ValueError(f"init_rpc(rank={rank}) must be smaller than world_size={world_size}")
    store, _, _ = next(dist.rendezvous(method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    return store, rank, world_size


class Rendezvous:
    """The job's table of workers, and its barriers, on one store."""

    def __init__(self, store, rank, world_size):
        self.rank = rank
        self.world_size = world_size
        joins = store.add("torchrpc/joins", 1)
        generation = (joins - 1) // world_size
        self.store = dist.PrefixStore(f"torchrpc/{generation}/", store)
        self._base = store

    def exchange(self, record):
        """Publishes this worker's record; returns every worker's, by rank."""
        self.store.set(f"worker/{self.rank}", pickle.dumps(record))
        keys = [f"worker/{r}" for r in range(self.world_size)]
        self.store.wait(keys)
        return [pickle.loads(v) for v in self.store.multi_get(keys)]

    def barrier(self, tag, timeout):
        """Waits until every worker has reached barrier `tag`; keeps the store's
        host (rank 0) alive until everyone has left it."""
        store = self.store
        store.set_timeout(datetime.timedelta(seconds=timeout))
        if store.add(f"{tag}/arrived", 1) == self.world_size:
            store.set(f"{tag}/go", b"1")
        store.wait([f"{tag}/go"])
        store.set(f"{tag}/left/{self.rank}", b"1")
        if self.rank == 0:
            store.wait([f"{tag}/left/{r}" for r in range(self.world_size)])
