"""Timing helpers: warm-up, per-call samples, medians and percentiles, CPU time.

Standard library only, so that the socket floor measurement does not import torch.
"""

import os
import signal
import statistics
import time


def percentile(samples, q):
    """The q-th percentile (0..100) of `samples`, by linear interpolation."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples):
    """{'median', 'p10', 'p90', 'p99', 'n'} of a list of numbers."""
    return {
        "median": statistics.median(samples),
        "p10": percentile(samples, 10),
        "p90": percentile(samples, 90),
        "p99": percentile(samples, 99),
        "n": len(samples),
    }


def time_each(fn, n, warmup):
    """Calls fn() `warmup` times untimed, then `n` times; returns the n durations (s)."""
    for _ in range(warmup):
        fn()
    clock = time.perf_counter
    samples = []
    for _ in range(n):
        start = clock()
        fn()
        samples.append(clock() - start)
    return samples


def time_interleaved(fns, n, warmup, block=100):
    """Like time_each for several functions, {key: fn}, in alternating blocks
    of `block` calls, so that each sees the same phases of the machine (its
    speed drifts by 10-30% within seconds); returns {key: n durations (s)}."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples = {key: [] for key in fns}
    while any(len(v) < n for v in samples.values()):
        for key, fn in fns.items():
            samples[key] += time_each(fn, min(block, n - len(samples[key])), 0)
    return samples


def rate_for(step, seconds):
    """Runs step() (which returns how many operations it did) repeatedly for at
    least `seconds`; returns operations per second."""
    done = 0
    start = time.perf_counter()
    while True:
        done += step()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed


def cpu_seconds(pid):
    """User + system CPU time of process `pid` (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # Fields after the ")" start at field 3 (state); utime and stime are fields 14 and 15.
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def idle_cpu_percent(pids, seconds):
    """Percent of one core each process in `pids` used while we slept `seconds`."""
    before = {pid: cpu_seconds(pid) for pid in pids}
    start = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - start
    return {pid: 100.0 * (cpu_seconds(pid) - before[pid]) / wall for pid in pids}


def stop_process(pid, timeout=10.0):
    """SIGSTOPs process `pid` and returns once every thread of it has stopped.

    kill() only starts the stop: one thread takes the signal and then stops
    the others, so until it gets a core (a sleeping worker on a busy machine)
    the others may still run.
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
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} not stopped {timeout:.0f} s after SIGSTOP: thread states {states}")
        time.sleep(0.001)
