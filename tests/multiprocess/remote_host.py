"""TORCHRPC_TEST_REMOTE_HOST=1: every Cluster's workers run on a second
"host", a network namespace joined to this one by a veth pair, so the job's
calls between rank 0 and the others travel over TCP between two hosts (the
workers of the namespace share a host, and Unix sockets, among themselves).
Rank 0 and the store stay here, at this side's veth address. Needs root and
the ip command; test_two_hosts.py runs functional modules this way."""

import atexit
import functools
import os
import random
import subprocess

ENABLED = os.environ.get("TORCHRPC_TEST_REMOTE_HOST") == "1"


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@functools.cache
def _host():
    """(namespace, this side's address): made once per process, removed at exit."""
    tag = f"{os.getpid() % 10000}{random.randrange(1000)}"
    ns, here, there = f"trpc{tag}h", f"trh{tag}a", f"trh{tag}b"
    subnet = f"10.{random.randrange(100, 250)}.{random.randrange(256)}"
    _ip("netns", "add", ns)
    atexit.register(subprocess.run, ["ip", "netns", "del", ns], capture_output=True, timeout=10)
    _ip("-n", ns, "link", "set", "lo", "up")
    _ip("link", "add", here, "type", "veth", "peer", "name", there)
    _ip("link", "set", there, "netns", ns)
    _ip("addr", "add", f"{subnet}.1/24", "dev", here)
    _ip("-n", ns, "addr", "add", f"{subnet}.2/24", "dev", there)
    _ip("link", "set", here, "up")
    _ip("-n", ns, "link", "set", there, "up")
    return ns, f"{subnet}.1"


def master_address():
    """Where workers reach rank 0 and the store."""
    return _host()[1] if ENABLED else "127.0.0.1"


def command(argv):
    """argv, run on the second host when enabled."""
    return ["ip", "netns", "exec", _host()[0], *argv] if ENABLED else list(argv)
