"""Rendezvous: workers find each other through a torch.distributed Store.

This module opens the store (``env://``, ``tcp://``, ``file://`` or an
explicit one) and validates names; the protocol on the store (each worker
publishes its name, rank, addresses and host id; barriers) is in C++
(csrc/rendezvous), run by the Worker (csrc/worker), shared with C++ workers.
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
    if rank != 0:
        _wait_for_store_host(method, options.init_timeout)
    store, _, _ = next(dist.rendezvous(method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    return store, rank, world_size

