"""What tests observe of a worker from outside: its memory, open files and
CPU time (/proc), its TCP address, and how fast it answers a real call."""

import os
import statistics
import time

import torchrpc as rpc
from benchmarks import _measure
from tests.multiprocess import funcs

# Calls slower than this never count as slow: the test machine is shared and noisy.
LATENCY_FLOOR = 0.05


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


cpu_seconds = _measure.cpu_seconds  # user + system CPU time of a process, in seconds


stop = _measure.stop_process  # SIGSTOPs a worker; returns once all its threads stopped


def tcp_address(worker):
    """(host, port) of `worker`'s TCP listener, as it reports it."""
    tcp, _unix = rpc.rpc_sync(worker, funcs.debug_info)["addresses"]
    host, port = tcp.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


def call_latency(worker, calls=5, timeout=5):
    """Median seconds of `calls` rpc_sync of a script function to `worker`."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        assert rpc.rpc_sync(worker, funcs.no_tensors, args=(21,), timeout=timeout) == 42
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def prompt_bound(baseline):
    """The latency a call may take while a worker is under attack: twice its
    usual one, but never less than LATENCY_FLOOR."""
    return max(2 * baseline, LATENCY_FLOOR)


def assert_serves_promptly(worker, baseline, what):
    """`worker` answers a real call within prompt_bound(baseline)."""
    latency = call_latency(worker)
    assert latency < prompt_bound(baseline), (
        f"{what}: {worker} answered in {latency * 1e3:.1f} ms (median of 5); usual latency "
        f"{baseline * 1e3:.2f} ms, bound {prompt_bound(baseline) * 1e3:.0f} ms")


# The heartbeat that tests of stopped and partitioned peers give their
# workers (TORCHRPC_HEARTBEAT_SECONDS), and how long detection may take: up
# to two periods (one of silence, one until the check), plus slack for a
# noisy machine.
HEARTBEAT_SECONDS = 2.0
HEARTBEAT_BOUND = 2 * HEARTBEAT_SECONDS + 2.0
