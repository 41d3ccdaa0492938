"""What tests observe of a worker from outside: its memory, open files and
CPU time (/proc), its TCP address, and how fast it answers a real call."""

import os
import signal
import statistics
import time

import torchrpc as rpc
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


def cpu_seconds(pid):
    """User + system CPU time the process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(pid, timeout=10.0):
    """SIGSTOPs process `pid` and returns once every thread of it has stopped.

    kill() only starts the stop: one thread takes the signal and then stops
    the others, so until it gets a core (a sleeping worker on a busy machine)
    the others may still serve a call.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # the thread exited
                pass
        if all(state in ("T", "t") for state in states):
            return
        assert time.monotonic() < deadline, f"process {pid} not stopped {timeout:.0f} s after SIGSTOP: {states}"
        time.sleep(0.001)


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
