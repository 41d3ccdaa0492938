"""CPU-bound scaling, probed against the machine's own ceiling.

    .venv/bin/python benchmarks/scaling_probe.py [--rounds 12] [--round-s 0.5]

One torchrpc callee and two caller processes on 127.0.0.1, as in the
``scaling`` job of run_all.py. Each round measures, back to back: the
ceiling (on the callee, two threads running ``busy_script`` with no RPC,
over one thread), one caller alone, and both callers together. On the
development VM the ceiling moves between 1.7x and 2.0x from one second to
the next, so a scaling ratio means little without the ceiling of its own
rounds. Prints each round and the medians; torchrpc only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _measure, launch  # noqa: E402

CALLERS = 2


def limit_s(rounds, round_s):
    """How long any wait of a probe may take: start-up, then 4 windows a round."""
    return 90 + 4 * rounds * round_s


def caller(rpc, control, index, rounds, round_s):
    """Caller `index`; caller 0 also measures the ceiling and 1 caller alone,
    and returns the rounds."""
    from benchmarks import remote_fns

    def call():
        rpc.rpc_sync("callee", remote_fns.busy_script, args=(remote_fns.BUSY_ITERS,))
        return 1

    for _ in range(5):
        call()
    out = []
    for r in range(rounds):
        if index == 0:
            ceiling = rpc.rpc_sync("callee", remote_fns.local_scaling, args=(round_s, remote_fns.BUSY_ITERS))
            one = _measure.rate_for(call, round_s)
        control.barrier(f"both/{r}", CALLERS)
        control.set(f"rate/{r}/{index}", repr(_measure.rate_for(call, round_s)))
        if index == 0:
            both = sum(float(control.get(f"rate/{r}/{i}")) for i in range(CALLERS))
            out.append({"ceiling": ceiling, "one": one, "both": both, "scaling": both / one})
    return out


def worker(rank, port, control_port, rounds, round_s):
    """Rank 0 serves; ranks 1.. call. Caller 0 prints the rounds as JSON."""
    import torchrpc as rpc
    from benchmarks.control import Control

    control = Control(control_port, "probe", CALLERS + 1, timeout=limit_s(rounds, round_s))
    rpc.init_rpc("callee" if rank == 0 else f"caller{rank - 1}", rank=rank, world_size=CALLERS + 1,
                 rpc_backend_options=rpc.RpcOptions(num_worker_threads=16, init_method=f"tcp://127.0.0.1:{port}"))
    result = caller(rpc, control, rank - 1, rounds, round_s) if rank > 0 else None
    control.barrier("finished")
    rpc.shutdown()
    if rank == 1:
        print(json.dumps(result))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--round-s", type=float, default=0.5)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--control", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.port, args.control, args.rounds, args.round_s)
        return 0

    import datetime

    import torch.distributed as dist

    limit = limit_s(args.rounds, args.round_s)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=limit))
    port = launch.free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.scaling_probe", "--worker", str(rank),
                               "--port", str(port), "--control", str(store.port),
                               "--rounds", str(args.rounds), "--round-s", str(args.round_s)],
                              cwd=launch.ROOT, stdout=subprocess.PIPE, text=True)
             for rank in range(CALLERS + 1)]
    deadline = time.monotonic() + limit
    outputs = []
    try:
        for rank, proc in enumerate(procs):
            try:
                outputs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                raise SystemExit(f"scaling probe: worker {rank} did not finish within {limit:.0f} s")
            if proc.returncode != 0:
                raise SystemExit(f"scaling probe: worker {rank} exited with {proc.returncode} (its stderr is above)")
    finally:
        for proc in procs:  # the others would wait at a barrier until the limit
            if proc.poll() is None:
                proc.kill()
    rounds = json.loads(outputs[1].strip().splitlines()[-1])
    print("round  ceiling  1 caller  2 callers  2/1    2/1 over ceiling")
    for i, r in enumerate(rounds):
        print(f"{i:>5}  {r['ceiling']:6.2f}x  {r['one']:6.0f}/s  {r['both']:7.0f}/s  {r['scaling']:4.2f}x  "
              f"{r['scaling'] / r['ceiling']:5.2f}")
    med = {k: statistics.median(r[k] for r in rounds) for k in ("ceiling", "one", "both", "scaling")}
    over = statistics.median(r["scaling"] / r["ceiling"] for r in rounds)
    print(f"median {med['ceiling']:6.2f}x  {med['one']:6.0f}/s  {med['both']:7.0f}/s  {med['scaling']:4.2f}x  {over:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
