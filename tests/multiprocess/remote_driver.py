"""Rank 0 of a job that the test process cannot join (it runs in another
network namespace, test_two_hosts.py): joins the job, then runs the checks
below one at a time as the test asks on stdin, one JSON line each
({"fn": name, "args": [...]}), answering one JSON line on stdout:
{"ok": true, "value": ...} or {"ok": false, "type": ..., "error": ...}.
Prints every thread's stack on SIGUSR1, as test workers do."""

import argparse
import faulthandler
import json
import signal
import statistics
import sys
import time

import torch

import torchrpc as rpc
from tests.multiprocess import funcs

PEER = "worker1"


def functional(tensor_mb):
    """A builtin, a script and a Python call, remote() + to_here(), and a
    tensor of `tensor_mb` MB there and back; returns what it checked."""
    ones = torch.ones(2)
    assert torch.equal(rpc.rpc_sync(PEER, torch.add, args=(ones, ones)), 2 * ones)
    assert torch.equal(rpc.rpc_sync(PEER, funcs.add, args=(ones, ones)), 2 * ones)
    assert rpc.rpc_sync(PEER, funcs.py_add, args=(1, 2)) == 3
    assert rpc.remote(PEER, funcs.py_add, args=(3, 4)).to_here() == 7
    big = torch.rand(tensor_mb << 18)  # float32: 4 bytes each
    assert torch.equal(rpc.rpc_sync(PEER, funcs.echo, args=(big,)), big)
    peers = rpc.rpc_sync(PEER, funcs.debug_info)["addresses"]
    return {"peer_addresses": list(peers), "my_addresses": list(rpc.api._debug_info()["addresses"])}


def latency(calls):
    """Median seconds of `calls` sequential rpc_sync."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        rpc.rpc_sync(PEER, funcs.no_tensors, args=(1,))
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def pipelined(calls):
    """Seconds until `calls` rpc_async, all in flight at once, completed."""
    started = time.perf_counter()
    futs = [rpc.rpc_async(PEER, funcs.no_tensors, args=(i,)) for i in range(calls)]
    assert [f.wait() for f in futs] == [2 * i for i in range(calls)]
    return time.perf_counter() - started


def timed_call(fn_name, args, timeout):
    """Runs funcs.<fn_name>(*args) on the peer with `timeout`; returns
    (seconds it took, None or (error type, message))."""
    started = time.monotonic()
    try:
        rpc.rpc_sync(PEER, getattr(funcs, fn_name), args=tuple(args), timeout=timeout)
        error = None
    except rpc.RpcError as exc:
        error = (type(exc).__name__, str(exc))
    return time.monotonic() - started, error


CHECKS = {f.__name__: f for f in (functional, latency, pipelined, timed_call)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-method", required=True)
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    rpc.init_rpc("worker0", rank=0, world_size=2,
                 rpc_backend_options=rpc.RpcOptions(init_method=args.init_method, init_timeout=60, rpc_timeout=10))
    print(json.dumps({"ok": True, "value": "joined"}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["fn"] == "exit":
            break
        try:
            reply = {"ok": True, "value": CHECKS[request["fn"]](*request.get("args", []))}
        except Exception as exc:
            reply = {"ok": False, "type": type(exc).__name__, "error": str(exc)}
        print(json.dumps(reply), flush=True)
    rpc.shutdown(graceful=False)


if __name__ == "__main__":
    main()
