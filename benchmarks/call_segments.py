"""Where an ``rpc_sync``'s time goes, step by step, without changing the
product: ``python benchmarks/call_segments.py [--api torchrpc|backend]
[--kind script|builtin|python|proxy] [--compute-us N]``. With
``--compute-us`` the caller computes that long before each call, as a
trainer does between its calls; such a call finds the other side's threads
asleep. ``proxy`` is the split-RNN's forward call (run_all's training):
``rref.rpc_sync().forward(tokens)`` of an embedding table on the callee,
inside a distributed autograd context.

Two worker processes run with an LD_PRELOAD shim (call_segments_shim.c,
built here with gcc) that timestamps the syscalls marking each step: the
caller's and callee's ``sendmsg`` of a frame, their first ``read`` of one,
and the wake-ups between threads. The caller times each ``rpc_sync`` on the
same clock. Printed: the median of each segment and which thread did its
step, and how often a step had to wake a sleeping thread (where a poll did
not catch it). TensorPipe sends with other calls, so only torchrpc's API and
the TORCHRPC backend are covered. Linux only; the shim slows each marked
syscall by well under a microsecond.
"""

import argparse
import bisect
import collections
import contextlib
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch  # noqa: E402

SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "call_segments_shim.c")
SEND, READ, WOKE, EPOLL = 1, 2, 3, 4  # the shim's event kinds
CALLEE, CALLER = "callee", "caller"
ROLES = (CALLEE, CALLER)  # by rank
WORKER_DEADLINE_S = 90  # before the smoke test gives up (110 s), so the workers are killed


def _worker(args):
    """One of the two processes: rank 0 serves, rank 1 times the calls."""
    from benchmarks import backends, scenarios

    backend = backends.load(args.api if args.api == "backend" else "torchrpc")
    rpc = backend.rpc
    if args.rank == 0 and args.kind == "proxy":
        scenarios.serve_split_rnn(backend)
    name = ROLES[args.rank]
    rpc.init_rpc(name, rank=args.rank, world_size=2, **backend.init_kwargs(args.port, 16, 60))
    if args.rank == 1:
        call, context = _call_of(args.kind, backend)
        with context:
            _time_calls(args, call)
    threads = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                threads[int(tid)] = f.read().strip()
        except OSError:
            pass  # the thread ended
    with open(os.path.join(args.dir, f"threads.{os.getpid()}.json"), "w") as f:
        json.dump(threads, f)
    rpc.shutdown()


def _call_of(kind, backend):
    """(the timed call, the context it runs in) for `kind`."""
    from benchmarks import run_all, scenarios

    if kind != "proxy":
        fn, fn_args = scenarios.LATENCY_CALLS[kind]
        return (lambda: backend.rpc.rpc_sync(CALLEE, fn, args=fn_args)), contextlib.nullcontext()
    m = scenarios.SplitRnn(backend, CALLEE, run_all.CONFIGS["full"]["rnn"])  # run_all's training model
    return (lambda: m.model.embedding.rpc_sync().forward(m.tokens)), backend.autograd.context()


def _time_calls(args, call):
    """Times args.warmup + args.calls calls of `call`; writes calls.json."""
    for _ in range(args.warmup):
        call()
    calls = []
    for _ in range(args.calls):
        if args.compute_us:  # the caller computes first, as a trainer does between calls
            until = time.monotonic_ns() + args.compute_us * 1000
            while time.monotonic_ns() < until:
                pass
        start = time.monotonic_ns()
        call()
        calls.append((start, time.monotonic_ns()))
    with open(os.path.join(args.dir, "calls.json"), "w") as f:
        json.dump({"pid": os.getpid(), "calls": calls}, f)


def _run(args, folder):
    """Builds the shim, runs the two workers under it; returns their events."""
    shim = os.path.join(folder, "shim.so")
    built = subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", shim, SHIM, "-ldl"], capture_output=True, text=True)
    if built.returncode != 0:
        sys.exit(f"call_segments: building the shim with gcc failed:\n{built.stderr}")
    env = dict(os.environ, LD_PRELOAD=shim, SEGMENTS_OUT=os.path.join(folder, "events"))
    port = launch.free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.call_segments", "--worker", str(rank),
                               "--port", str(port), "--dir", folder, "--api", args.api, "--kind", args.kind,
                               "--calls", str(args.calls), "--warmup", str(args.warmup),
                               "--compute-us", str(args.compute_us)],
                              cwd=launch.ROOT, env=env)
             for rank in (0, 1)]
    try:
        deadline = time.monotonic() + WORKER_DEADLINE_S
        for rank, proc in enumerate(procs):
            role = f"worker {rank} ({ROLES[rank]}, {args.api})"
            try:
                code = proc.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                sys.exit(f"call_segments: {role} still running after {WORKER_DEADLINE_S} s; killed (its output is above)")
            if code != 0:
                sys.exit(f"call_segments: {role} exited with {code} (its output is above)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    with open(os.path.join(folder, "calls.json")) as f:
        calls = json.load(f)
    threads, events = {}, {}
    for path in glob.glob(os.path.join(folder, "threads.*.json")):
        with open(path) as f:
            threads[int(path.split(".")[-2])] = {int(k): v for k, v in json.load(f).items()}
    for path in glob.glob(os.path.join(folder, "events.*")):
        with open(path) as f:
            events[int(path.rsplit(".", 1)[1])] = [tuple(map(int, line.split())) for line in f]
    return calls, threads, events


def segments(calls, threads, events):
    """Each call's steps, matched by time: the caller's first send after it
    began, the callee's first read after that, its first send after that
    read, and the caller's first read after that send (before the call
    returned). Returns one dict per call whose steps all matched."""
    caller = calls["pid"]
    callee = next(pid for pid in threads if pid != caller)  # the workers; not a child they started

    def series(pid, kind, tid=None):  # sorted (time, thread name); `tid`: that thread's only
        return sorted((ns, threads[pid].get(t, "?")) for ns, t, k in events[pid] if k == kind and tid in (None, t))

    def first(s, lo, hi):
        i = bisect.bisect_left(s, (lo, ""))
        return s[i] if i < len(s) and s[i][0] <= hi else None

    sends, reads = {p: series(p, SEND) for p in (caller, callee)}, {p: series(p, READ) for p in (caller, callee)}
    pool_woke = [e for e in series(callee, WOKE) if e[1] == "rpc-pool"]
    waiter_woke = series(caller, WOKE, tid=caller)  # the caller's main thread, which calls rpc_sync
    io_woke = [e for e in series(callee, EPOLL) if e[1] == "rpc-io"]
    out = []
    for start, end in calls["calls"][len(calls["calls"]) // 10:]:  # the first tenth: still settling
        a = first(sends[caller], start, end)
        b = a and first(reads[callee], a[0], end)
        c = b and first(sends[callee], b[0], end)
        d = c and first(reads[caller], c[0], end)
        if not d:
            continue
        out.append({
            "issue": (a[0] - start, a[1]), "to callee": (b[0] - a[0], b[1]), "callee": (c[0] - b[0], c[1]),
            "to caller": (d[0] - c[0], d[1]), "complete": (end - d[0], threads[caller].get(caller, "?")), "total": (end - start, ""),
            "callee I/O thread slept": first(io_woke, a[0], b[0]) is not None,
            "callee pool thread woken": first(pool_woke, b[0], c[0]) is not None,
            "caller's waiting thread woken": first(waiter_woke, d[0], end) is not None,
        })
    return out


STEPS = {"issue": "rpc_sync entered -> request's send", "to callee": "request's send -> callee read it",
         "callee": "callee read it -> response's send", "to caller": "response's send -> caller read it",
         "complete": "caller read it -> rpc_sync returned", "total": ""}


def report(rows, args):
    after = f", each after {args.compute_us} µs of compute" if args.compute_us else ""
    print(f"{args.api}, rpc_sync of a {args.kind} call{after}: {len(rows)} calls matched; median µs")
    for step, what in STEPS.items():
        who = collections.Counter(r[step][1] for r in rows).most_common(1)[0][0]
        median = statistics.median(r[step][0] for r in rows) / 1000
        print(f"  {step:<10} {median:7.1f}  {what:<38} {who}")
    flags = ("callee I/O thread slept", "callee pool thread woken", "caller's waiting thread woken")
    print("share of calls where the", "; ".join(f"{flag}: {sum(r[flag] for r in rows) / len(rows):.0%}"
                                             for flag in flags))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=("torchrpc", "backend"), default="torchrpc")
    parser.add_argument("--kind", choices=("script", "builtin", "python", "proxy"), default="script")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--compute-us", type=int, default=0,
                        help="the caller computes this long before each call (a call after compute is cold)")
    parser.add_argument("--worker", type=int, dest="rank", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        _worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="call-segments-") as folder:
        rows = segments(*_run(args, folder))
    if not rows:
        sys.exit("call_segments: no call's steps could be matched")
    report(rows, args)


if __name__ == "__main__":
    main()
