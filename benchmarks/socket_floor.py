"""The floor for an RPC round trip: a 1-byte ping-pong over a Unix stream
socket between two processes, with blocking reads.

Run as ``python -m benchmarks.socket_floor [--n N]``; prints a JSON summary of
the per-round-trip µs. Imports no torch (the child is a plain fork).
"""

import argparse
import json
import os
import signal
import socket
import time

from benchmarks import _measure


def _echo(sock):
    while True:
        data = sock.recv(1)
        if not data:
            return
        sock.sendall(data)


def pingpong(n, warmup):
    """Per-round-trip µs summary of n 1-byte round trips (after `warmup`)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        ours.close()
        try:
            _echo(theirs)
        finally:
            os._exit(0)
    theirs.close()
    try:
        def round_trip():
            ours.sendall(b"x")
            ours.recv(1)

        samples = _measure.time_each(round_trip, n, warmup)
    finally:
        ours.close()  # the child sees EOF and exits
        _reap(pid, timeout=5)
    return _measure.summarize([s * 1e6 for s in samples])


def _reap(pid, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="timed round trips")
    args = parser.parse_args(argv)
    print(json.dumps(pingpong(args.n, warmup=max(100, args.n // 10))))


if __name__ == "__main__":
    main()
