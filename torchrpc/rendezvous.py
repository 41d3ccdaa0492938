"""Rendezvous: workers find each other through a torch.distributed Store.

This module opens the store (``env://``, ``tcp://``, ``file://`` or an
explicit one) and validates names; the protocol on the store (each worker
publishes its name, rank, addresses and host id; barriers; the members of a
dynamic job) is in C++ (csrc/rendezvous), run by the Worker (csrc/worker),
shared with C++ workers.
"""

import datetime
import os
import re
import socket
import time
import urllib.parse

import torch.distributed as dist

from torchrpc import constants, errors

_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")


def validate_name(name, where="init_rpc(name=...)"):
    """Raises TypeError, or InvalidWorkerNameError (a RuntimeError and a
    ValueError, with upstream's phrases), if `name` cannot name a worker."""
    if not isinstance(name, str):
        raise TypeError(f"{where} expects a str; got {type(name).__name__}")
    if not name:
        raise errors.InvalidWorkerNameError(f"{where}: a worker name must be non-empty")
    if len(name) >= constants.MAX_NAME_LENGTH:
        raise errors.InvalidWorkerNameError(
            f"{where}: worker name {name[:40]!r}... has {len(name)} characters; it must be shorter than "
            f"{constants.MAX_NAME_LENGTH}")
    if not _NAME_RE.match(name):
        raise errors.InvalidWorkerNameError(
            f"{where}: invalid worker name {name!r}: Worker name must match ^[A-Za-z0-9_.:-]+$ "
            "(letters, digits, '_', '-', '.' and ':')")


def host_id():
    """Identifies this host and network namespace: workers with equal ids talk
    over Unix sockets (abstract names are per network namespace). The same
    function serves C++ workers (csrc/worker)."""
    from torchrpc._extension import native

    return native().local_host_id()


def _store_address(init_method):
    """(host, port) of the TCPStore that rank 0 hosts; (None, None) for file://."""
    if init_method.startswith("tcp://"):
        url = urllib.parse.urlparse(init_method)
        return url.hostname, url.port
    if init_method.startswith("env://"):
        port = os.environ.get("MASTER_PORT")
        return os.environ.get("MASTER_ADDR"), int(port) if port else None
    return None, None


def _wait_for_store_host(init_method, timeout):
    """Waits until rank 0's store accepts connections. A TCPStore client that
    comes first backs off for up to a second between attempts; polling here
    every few ms makes a job whose ranks start together join in milliseconds."""
    address = _store_address(init_method)
    if not address[0] or not address[1]:
        return
    deadline = time.monotonic() + (timeout or 1e6)
    while time.monotonic() < deadline:
        try:
            socket.create_connection(address, timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.005)


def listen_host(init_method):
    """The interface to accept TCP connections on: TORCHRPC_LISTEN_ADDR if set,
    loopback when the job's master is on loopback, else the address this host
    uses to reach the master."""
    override = os.environ.get("TORCHRPC_LISTEN_ADDR")
    if override:
        return override
    master = _store_address(init_method)[0]
    if not master or master in ("localhost",) or master.startswith("127.") or master == "::1":
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))  # no packet is sent for UDP connect
            return s.getsockname()[0]
    except OSError:
        return "0.0.0.0"


def open_store(options, rank, world_size):
    """Returns (store, rank, world_size), resolving -1/None from the environment.

    world_size None (and no WORLD_SIZE with env://) is a dynamic job: workers
    join and leave while it runs (csrc/worker/membership.h); world_size stays None.
    """
    timeout = datetime.timedelta(seconds=options.init_timeout or 1e6)
    method = options.init_method
    if options.store is None and method.startswith("env://"):
        rank = int(os.environ["RANK"]) if (rank is None or rank < 0) and "RANK" in os.environ else rank
        if world_size is None and "WORLD_SIZE" in os.environ:
            world_size = int(os.environ["WORLD_SIZE"])
    _check_rank(options, rank, world_size)
    if options.store is not None:
        return options.store, rank, world_size
    if method.startswith("env://"):
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise ValueError(
                f"init_method='env://' needs the environment variables {', '.join(missing)} "
                "(torchrun sets them), or pass RpcOptions(init_method='tcp://host:port')"
            )
    if rank != 0:
        _wait_for_store_host(method, options.init_timeout)
    if world_size is None or (rank == 0 and _store_address(method)[0]):
        # torch's rendezvous handlers take a job without a size as world_size=-1
        # in the URL (its stores then wait for no number of workers). Rank 0's
        # TCPStore is made so too: its constructor would wait for the whole
        # job, deaf to Ctrl-C; the Worker's exchange waits for it instead.
        sep = "&" if "?" in method else "?"
        store, _, _ = next(dist.rendezvous(f"{method}{sep}rank={rank}&world_size=-1", timeout=timeout))
    else:
        store, _, _ = next(dist.rendezvous(method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    return store, rank, world_size


def _check_rank(options, rank, world_size):
    """Raises ValueError for a missing or impossible rank or world size, with
    torch's key phrases ("rank parameter missing", "environment variable RANK
    expected")."""
    if rank is None or rank < 0:
        if options.store is None and options.init_method.startswith("env://"):
            raise ValueError(
                "init_rpc needs a rank: environment variable RANK expected with init_method='env://', "
                "but not set; set it (torchrun does) or pass init_rpc(rank=...)"
            )
        raise ValueError("init_rpc needs a rank (rank parameter missing): pass init_rpc(rank=...)")
    if world_size is None:
        if rank > constants.MAX_DYNAMIC_RANK:
            raise ValueError(
                f"init_rpc(rank={rank}): a worker of a job without world_size needs a rank "
                f"in [0, {constants.MAX_DYNAMIC_RANK}]"
            )
        return
    if world_size < 1:
        raise ValueError(f"init_rpc(world_size={world_size}): use world_size >= 1, or None for a job that workers "
                         "join and leave while it runs")
    if rank >= world_size:
        raise ValueError(f"init_rpc(rank={rank}) must be smaller than world_size={world_size}")

