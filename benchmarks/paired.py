"""Two or more RPC implementations measured in alternating short blocks, the
others stopped meanwhile, so that all of them meet the same phases of the
machine: ``python -m benchmarks.paired [--sides torch,torchrpc]
[--modes one,separate] [--kinds ...] [--blocks 20] [--block-s 0.5]``.

The development VM switches between two speeds about 1.8x apart, every few
seconds to minutes (benchmarks/HISTORY.md, 2026-11-30), so two jobs of one
``run_all`` can meet different speeds. Here every side keeps its pair of
workers (a callee and a caller) running for the whole run; the driver
stops every side's processes (SIGSTOP) and wakes one side at a time
(SIGCONT) for one block of one kind. A stopped side uses no CPU: torch's
idle busy-polling does not touch the other side's blocks. Before each pair
of blocks the driver times the speed probe, so each block pair is labeled
fast or slow.

A side is a backend name (benchmarks/backends.py), optionally followed by
``@`` and environment settings for its workers, comma-separated:
``torchrpc@TORCHRPC_SPIN_US=0`` compares a setting; a ``PYTHONPATH`` setting
compares another build of torchrpc.

Kinds: the tiny ``rpc_sync`` calls of scenarios.LATENCY_CALLS (median µs
per call) and ``async_<kind>``: rounds of 128 ``rpc_async`` then
``wait_all`` (calls/s). Reported per mode and kind: each side's median
over the blocks and the median over block pairs of the ratio of every side
to the first (how many times faster), overall and by phase.
"""

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch  # noqa: E402
from benchmarks.run_all import speed_probe  # noqa: E402

KINDS = ("script", "builtin", "python", "async_script", "async_builtin", "async_python")
IN_FLIGHT = 128
FAST_BELOW_MS = 1.4  # a speed probe under this is the fast phase (about 1.0 fast, 1.8 slow)
MARK = "PAIRED "  # the caller's protocol lines on stdout start with this
START_TIMEOUT_S = 120  # for every side's workers to start and warm up
REPLY_MARGIN_S = 30  # a block's reply may come this much later than its length


def _parse_side(text):
    """'name@K=V,K2=V2' -> (label, backend name, {K: V})."""
    name, _, settings = text.partition("@")
    env = dict(item.split("=", 1) for item in settings.split(",") if item) if settings else {}
    return text, name, env


# --- the workers -------------------------------------------------------------


def _measure_block(rpc, kind, seconds):
    from benchmarks import _measure, scenarios

    if kind.startswith("async_"):
        fn, args = scenarios.LATENCY_CALLS[kind[len("async_"):]]
        batch = scenarios._batch(rpc, "callee", fn, args, IN_FLIGHT)
        batch()  # warm-up
        return _measure.rate_for(batch, seconds)
    fn, args = scenarios.LATENCY_CALLS[kind]
    call = lambda: rpc.rpc_sync("callee", fn, args=args)  # noqa: E731
    samples = _measure.time_each(call, 20, 20)  # after 20 untimed: at least 20 samples
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        samples += _measure.time_each(call, 20, 0)
    return statistics.median(samples) * 1e6


def worker(backend_name, rank, port, kinds):
    """Rank 0 serves until the caller shuts down; rank 1 warms every kind up,
    says it is ready, then runs the blocks its stdin asks for."""
    from benchmarks import backends, scenarios  # noqa: F401 (the callee too: torch's needs its script functions)

    backend = backends.load(backend_name)
    rpc = backend.rpc
    rpc.init_rpc(("callee", "caller")[rank], rank=rank, world_size=2, **backend.init_kwargs(port, 16, 60))
    if rank == 1:
        for kind in kinds:
            _measure_block(rpc, kind, 0.05)
        print(MARK + "ready", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "quit":
                break
            kind, seconds = words[0], float(words[1])
            print(MARK + json.dumps({"kind": kind, "value": _measure_block(rpc, kind, seconds)}), flush=True)
    rpc.shutdown()


# --- the driver --------------------------------------------------------------


class _Side:
    """One side's two worker processes, each a process group of its own."""

    def __init__(self, text, mode, kinds, tmp):
        self.label, self.backend, env = _parse_side(text)
        # Run from `tmp`, the repository after the side's own PYTHONPATH: a
        # side can bring another build of torchrpc.
        path = [p for p in (env.get("PYTHONPATH"), launch.ROOT) if p]
        env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(path)}
        port = launch.free_port()
        self.logs, self.procs = [], []
        for rank in (0, 1):
            self.logs.append(os.path.join(tmp, f"{len(os.listdir(tmp))}-{self.backend}-rank{rank}.log"))
            with open(self.logs[-1], "w") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.paired", "--worker", self.backend, "--rank", str(rank),
                     "--port", str(port), "--kinds", ",".join(kinds)],
                    cwd=tmp, env=env, stdin=subprocess.PIPE if rank else subprocess.DEVNULL,
                    stdout=subprocess.PIPE if rank else log, stderr=log, text=True, **launch.MODES[mode]))
        self.caller = self.procs[1]

    def signal(self, sig):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, sig)

    def reply(self, deadline):
        """The caller's next protocol line (without MARK), or JobFailed."""
        while True:
            left = deadline - time.monotonic()
            failed = [p.returncode for p in self.procs if p.poll() not in (None, 0)]
            if failed or left <= 0:
                raise launch.JobFailed(f"{self.label}: " + (f"a worker exited with {failed[0]}" if failed else
                                       "no reply before the deadline") + "\n" + self.tails())
            ready, _, _ = select.select([self.caller.stdout], [], [], min(left, 1.0))
            if ready:
                line = self.caller.stdout.readline()
                if not line:
                    raise launch.JobFailed(f"{self.label}: the caller closed its output\n" + self.tails())
                if line.startswith(MARK):
                    return line[len(MARK):].strip()

    def ask(self, kind, seconds):
        self.caller.stdin.write(f"{kind} {seconds}\n")
        self.caller.stdin.flush()
        return json.loads(self.reply(time.monotonic() + seconds + REPLY_MARGIN_S))["value"]

    def finish(self, deadline):
        self.signal(signal.SIGCONT)
        try:
            self.caller.stdin.write("quit\n")
            self.caller.stdin.close()
        except OSError:
            pass
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            launch._kill(proc)

    def tails(self):
        return "\n".join(f"--- {os.path.basename(p)} ends:\n{launch._tail(p)}" for p in self.logs)


def run_mode(sides, mode, kinds, blocks, block_s):
    """Every side's workers in launch mode `mode`, then `blocks` rounds of
    every kind, one side awake at a time. Returns
    {kind: [{"probe_ms": ms, side label: value, ...} per block]}."""
    out = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix=f"paired-{mode}-") as tmp:
        started = []
        try:
            for text in sides:
                started.append(_Side(text, mode, kinds, tmp))
            for side in started:
                if side.reply(time.monotonic() + START_TIMEOUT_S) != "ready":
                    raise launch.JobFailed(f"{side.label}: unexpected first line\n" + side.tails())
                side.signal(signal.SIGSTOP)
            for block in range(blocks):
                for k, kind in enumerate(kinds):
                    order = started if (block + k) % 2 == 0 else started[::-1]
                    row = {"probe_ms": speed_probe(0.05)}
                    for side in order:
                        side.signal(signal.SIGCONT)
                        row[side.label] = side.ask(kind, block_s)
                        side.signal(signal.SIGSTOP)
                    out[kind].append(row)
        finally:
            deadline = time.monotonic() + 30
            for side in started:
                side.finish(deadline)
    return out


def speedup(kind, base, other):
    """How many times faster `other` is than `base` (µs for tiny calls, calls/s in flight)."""
    return other / base if kind.startswith("async_") else base / other


def summarize(rows, kind, labels):
    """Each side's median value and each later side's median speedup over
    the first, over all block pairs and by phase."""
    base = labels[0]
    out = {"blocks": len(rows), "median": {label: statistics.median(r[label] for r in rows) for label in labels}}
    for phase, keep in (("all", lambda r: True), ("fast", lambda r: r["probe_ms"] < FAST_BELOW_MS),
                        ("slow", lambda r: r["probe_ms"] >= FAST_BELOW_MS)):
        chosen = [r for r in rows if keep(r)]
        out[phase] = {"blocks": len(chosen)}
        for label in labels[1:]:
            out[phase][label] = statistics.median(speedup(kind, r[base], r[label]) for r in chosen) if chosen else None
    return out


def report(results, labels):
    lines = []
    for mode, by_kind in results.items():
        lines.append(f"{launch.MODE_LABELS[mode]}: {' / '.join(labels)}; speed-up over {labels[0]} "
                     "(median of block pairs): all, fast phase, slow phase")
        for kind, s in by_kind.items():
            unit = "calls/s" if kind.startswith("async_") else "µs"
            values = " / ".join(f"{s['median'][label]:,.0f}" for label in labels)
            ratios = "; ".join(
                f"{label}: " + ", ".join("-" if s[p][label] is None else f"{s[p][label]:.2f}x ({s[p]['blocks']})"
                                         for p in ("all", "fast", "slow"))
                for label in labels[1:])
            lines.append(f"  {kind:14s} {values} {unit}; {ratios}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", default="torch,torchrpc",
                        help="comma-separated sides, the first is the base (name or name@K=V;K2=V2)")
    parser.add_argument("--modes", default="one,separate")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--blocks", type=int, default=20, help="rounds of every kind (default 20)")
    parser.add_argument("--block-s", type=float, default=0.5, help="seconds of one block (default 0.5)")
    parser.add_argument("--out", help="write the blocks and the summary here (JSON)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if args.worker:
        return worker(args.worker, args.rank, args.port, kinds)
    # Settings inside a side use ';' on the command line (',' separates sides).
    sides = [s.replace(";", ",") for s in args.sides.split(",") if s]
    unknown = [k for k in kinds if k not in KINDS]
    if len(sides) < 2 or unknown or args.blocks < 1 or args.block_s <= 0:
        parser.error(f"need two sides or more, kinds among {', '.join(KINDS)}, --blocks >= 1, --block-s > 0")
    labels = [_parse_side(s)[0] for s in sides]
    blocks, results = {}, {}
    for mode in args.modes.split(","):
        blocks[mode] = run_mode(sides, mode, kinds, args.blocks, args.block_s)
        results[mode] = {kind: summarize(rows, kind, labels) for kind, rows in blocks[mode].items()}
    print(report(results, labels))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"sides": labels, "blocks": blocks, "summary": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
