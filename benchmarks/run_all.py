"""torchrpc vs torch.distributed.rpc, side by side, in one run (``make bench``).

    .venv/bin/python benchmarks/run_all.py            # full run
    .venv/bin/python benchmarks/run_all.py --quick    # smoke run, a few minutes
    .venv/bin/python benchmarks/run_all.py --out DIR  # default benchmarks/results/
    .venv/bin/python benchmarks/run_all.py --modes one  # one launch mode only

Every job runs in both launch modes (benchmarks.launch.MODES): its processes
in one session, as torchrun starts them, and each in a session of its own,
as separate terminals, services or containers start them. In each mode, the
same scenarios run first on torch.distributed.rpc (TensorPipe) and then on
torchrpc, each backend in fresh worker processes on 127.0.0.1 with fresh
ports; then, for ``main`` and ``training``, the same torch.distributed.rpc
program on torchrpc's TORCHRPC backend (``backend``: issue #23):

- ``main`` (callee + caller): idle CPU, rpc_sync latency, rpc_async
  throughput with 1/16/128 in flight, tensor send 1 KB..64 MB;
- ``scaling`` (callee + 2 caller processes): a CPU-bound callee with 1 and
  2 concurrent callers;
- ``training``: the split RNN of tutorials/distributed_rnn.py;
- ``compute`` (callee + caller): a callee that runs a small CNN inside its
  calls, against the same forward pass in the caller;
- ``beside`` (callee + caller + a compute loop that is not in the RPC job):
  the loop's speed beside idle workers and workers that call now and then,
  against its speed without them;
- ``init`` with 2 and 4 workers: init_rpc and shutdown times;
- ``exported`` (torchrpc only; callee + 2 callers): exported programs
  (torch.export + AOTInductor): a tiny call next to script and Python, a
  CPU-bound program's scaling, the first call's costs. Its programs are
  compiled once per run, before the jobs (benchmarks.exported_fns).

With ``--rounds N`` each job runs N times, the backends taking turns round
by round, and each number is the median over the rounds: the VM's speed
flips by up to 2x for seconds at a time with nothing else running
(benchmarks/HISTORY.md, 2026-11-30), so one backend measured in a slow
stretch and the next in a fast one would read a ratio the code did not
cause. Before each job a reference loop in this process (the speed probe)
times the machine; the report gives each backend's range.

Then it prints the table, the two modes side by side (with the targets,
PASS/MISS), and writes ``results.json``, ``results.md`` and ``ratios.png``
into the out dir. A job that fails or hangs is reported (with its log tail)
and its rows read n/a.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import backends, launch, report  # noqa: E402

KB, MB = 1 << 10, 1 << 20

#: The run's sizes; ``quick`` is a smoke run.
CONFIGS = {
    "full": {
        "threads": 16, "rpc_timeout": 60.0,
        "latency_samples": 2000, "latency_warmup": 200,
        "throughput_depths": [1, 16, 128], "throughput_rounds": 5, "throughput_round_s": 0.3,
        "send_sizes": [KB, MB, 16 * MB, 64 * MB], "send_reps": [1000, 100, 20, 10],
        "idle_s": 2.0, "unseen_reps": 5, "rref_samples": 1000, "rref_churn": 10000,
        "cpu_rounds": 6, "cpu_round_s": 0.5,
        "init_reps": 7,
        "floor_round_trips": 20000,
        "train_iterations": 300,
        "rnn": {"ntoken": 50, "ninp": 32, "nhid": 64, "nlayers": 2, "seq_len": 12, "batch": 16},
        "compute_calls": 200,
        "beside_rounds": 5, "beside_window_s": 0.6,
        "job_timeout_s": 150.0,
        "jobs": ["main", "scaling", "training", "compute", "beside", "init2", "init4", "exported"],
    },
    "quick": {
        "threads": 16, "rpc_timeout": 30.0,
        "latency_samples": 200, "latency_warmup": 30,
        "throughput_depths": [1, 16, 128], "throughput_rounds": 1, "throughput_round_s": 0.1,
        "send_sizes": [KB, MB, 16 * MB, 64 * MB], "send_reps": [50, 10, 3, 2],
        "idle_s": 1.0, "unseen_reps": 1, "rref_samples": 100, "rref_churn": 1000,
        "cpu_rounds": 1, "cpu_round_s": 0.3,
        "init_reps": 2,
        "floor_round_trips": 2000,
        "train_iterations": 30,
        "rnn": {"ntoken": 50, "ninp": 32, "nhid": 64, "nlayers": 2, "seq_len": 12, "batch": 16},
        "compute_calls": 20,
        "beside_rounds": 1, "beside_window_s": 0.3,
        "job_timeout_s": 60.0,
        "jobs": ["main", "training", "compute", "beside", "init4", "exported"],
    },
}

#: (result key, job, world size): what can run, in order, for each backend
#: (a config's "jobs" picks by result key).
JOBS = [("main", "main", 2), ("scaling", "scaling", 3), ("training", "training", 2),
        ("compute", "compute", 2), ("beside", "beside", 3), ("init2", "init", 2), ("init4", "init", 4),
        ("exported", "exported", 3)]
#: The rank whose result a job reports (default 1, the caller).
RESULT_RANK = {"beside": 2}


def speed_probe(seconds=0.2):
    """Median ms of a fixed pure-Python loop over `seconds`: the VM's speed
    at this moment (about 1.0 fast, 1.8 slow on the development VM)."""
    samples = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        sum(i * i for i in range(20000))
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def socket_floor(cfg):
    """Runs benchmarks.socket_floor in a child process; returns its summary."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.socket_floor", "--n", str(cfg["floor_round_trips"])],
                          cwd=launch.ROOT, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(proc.stdout)


def _floor(cfg, errors):
    """One socket floor measurement, printed; None (and an error) on failure."""
    print("  socket floor ...", end="", flush=True)
    try:
        floor = socket_floor(cfg)
    except (subprocess.SubprocessError, ValueError) as err:
        errors["socket_floor"] = str(err)
        print(" FAILED")
        return None
    print(f" {floor['median']:.1f} µs")
    return floor


def run_backends(names, modes, cfg, torch_transports, errors, rounds=1, probes=None):
    """Runs every job in every launch mode on every backend, `rounds` times
    with the backends taking turns; returns results[mode][backend][result
    key] (medians over the rounds). `probes` ({"mode/backend/job": [ms]})
    gets the speed probe taken before each job."""
    import torch.distributed as dist

    control = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                            timeout=datetime.timedelta(seconds=cfg["job_timeout_s"]))
    results = {mode: {name: {} for name in names} for mode in modes}
    with tempfile.TemporaryDirectory(prefix="torchrpc-bench-exported-") as folder:
        _run_jobs(names, modes, cfg, torch_transports, errors, control, results, folder, rounds,
                  {} if probes is None else probes)
    return results


def _prepare_exported(folder, errors):
    """Exports and compiles the ``exported`` job's programs into `folder`, in
    a fresh process with an empty cache; returns what exported_fns printed,
    or None (and an error) on failure."""
    print("  exported programs: export + AOTInductor compile ...", end="", flush=True)
    try:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.exported_fns", "--dir", folder],
                              cwd=launch.ROOT, capture_output=True, text=True, timeout=300, check=True)
        prepared = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as err:
        errors["exported/compile"] = f"{err}\n{getattr(err, 'stderr', '') or ''}"[-3000:]
        print(" FAILED")
        return None
    prepared["dir"] = folder
    print(" " + ", ".join(f"{k} {s:.1f} s" for k, s in prepared["compile_s"].items()))
    return prepared


def _run_jobs(names, modes, cfg, torch_transports, errors, control, results, folder, rounds, probes):
    for key, job, world in JOBS:
        if key not in cfg["jobs"]:
            continue
        if key == "exported":
            if not any(backends.runs(n, key) for n in names):
                continue
            cfg = dict(cfg, exported=_prepare_exported(folder, errors))
            if cfg["exported"] is None:
                continue
        for mode in modes:
            runs = {name: [] for name in names if backends.runs(name, key)}
            for rnd in range(rounds):
                for name in runs:
                    where = f"{mode}/{name}/{key}"  # names the job in errors and probes
                    if where in errors:
                        continue  # failed in an earlier round
                    ranks = _run_one(key, job, world, mode, name, cfg, torch_transports, errors, where, control,
                                     probes.setdefault(where, []), rnd, rounds)
                    if ranks is not None:
                        runs[name].append(report.aggregate_init(ranks) if job == "init"
                                          else ranks[RESULT_RANK.get(job, 1)])
            for name, got in runs.items():
                if got:
                    results[mode][name][key] = report.median_of_rounds(got)
                    if key == "exported":  # compiled once per run, shown in every mode
                        results[mode][name][key]["compile"] = cfg["exported"]


def _run_one(key, job, world, mode, name, cfg, torch_transports, errors, where, control, probes, rnd, rounds):
    """Round `rnd` of one job on one backend in one mode, after a speed probe
    (appended to `probes`); its ranks' results, or None (and errors[where])
    if it failed."""
    reps = cfg["init_reps"] if job == "init" else 1
    probes.append(speed_probe())
    start = time.monotonic()
    label = f" round {rnd + 1}/{rounds}" if rounds > 1 else ""
    print(f"  {launch.MODE_LABELS[mode]:<17} {backends.LABELS[name]:<22} {key:<8} "
          f"({world} processes{label}) ...", end="", flush=True)
    try:
        ranks = launch.run_job(job, name, world, control.port, cfg, cfg["job_timeout_s"],
                               ports=[launch.free_port() for _ in range(reps)],
                               torch_transports=torch_transports, mode=mode, round_index=rnd)
    except launch.JobFailed as err:
        print(" FAILED")
        errors[where] = str(err)
        print(f"    {err}".replace("\n", "\n    "), file=sys.stderr)
        return None
    print(f" {time.monotonic() - start:.1f} s (speed probe {probes[-1]:.2f} ms)")
    return ranks


def speed_summary(probes, names, rounds):
    """A sentence for the report: each backend's range of speed probes."""
    ranges = []
    for name in names:
        values = [v for where, got in probes.items() if where.split("/")[1] == name for v in got]
        if values:
            ranges.append(f"{backends.LABELS[name]} {min(values):.2f}-{max(values):.2f}")
    if not ranges:
        return ""
    how = f"medians of {rounds} rounds, backends taking turns; " if rounds > 1 else ""
    return (f" {how}Speed probe before each job (ms of a reference loop; the VM's speed, lower is faster): "
            + ", ".join(ranges) + ".")


def metadata(cfg_name, torch_transports):
    """Where and how the numbers were taken."""
    import torch

    cores = os.cpu_count()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    transports = ",".join(torch_transports) if torch_transports else "default"
    return {
        "config": cfg_name, "when": when, "host": platform.node(), "cores": cores,
        "python": platform.python_version(), "torch": torch.__version__,
        "torch_transports": transports,
        "summary": f"{cfg_name} run, {when}, {cores} cores, torch {torch.__version__}, "
                   f"TensorPipe transports: {transports}.",
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (a few minutes)")
    parser.add_argument("--out", default=os.path.join(launch.ROOT, "benchmarks", "results"),
                        help="directory for results.json, results.md, ratios.png")
    parser.add_argument("--backends", default=",".join(backends.NAMES),
                        help="comma-separated subset of: " + ", ".join(backends.NAMES))
    parser.add_argument("--modes", default=",".join(launch.MODES),
                        help="comma-separated launch modes: " + ", ".join(launch.MODES))
    parser.add_argument("--jobs", default=None,
                        help="comma-separated subset of the config's jobs (e.g. training)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run each job this many times, the backends taking turns; report medians")
    parser.add_argument("--torch-transports", default=None,
                        help="TensorPipe transports for torch.distributed.rpc, e.g. 'uv' (default: its own choice)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    names = [n for n in backends.NAMES if n in args.backends.split(",")]
    modes = [m for m in launch.MODES if m in args.modes.split(",")]
    transports = args.torch_transports.split(",") if args.torch_transports else None
    cfg_name = "quick" if args.quick else "full"
    cfg = dict(CONFIGS[cfg_name])
    if args.jobs:
        cfg["jobs"] = [j for j in cfg["jobs"] if j in args.jobs.split(",")]
    started = time.monotonic()
    load = os.getloadavg()
    print(f"torchrpc benchmarks ({cfg_name}): {', '.join(backends.LABELS[n] for n in names)}; "
          f"{', '.join(launch.MODE_LABELS[m] for m in modes)}; "
          f"load average {load[0]:.2f} (numbers are noisy when other work runs)")
    errors = {}
    floors = [_floor(cfg, errors)]
    probes = {}
    results = run_backends(names, modes, cfg, transports, errors, args.rounds, probes)
    floors.append(_floor(cfg, errors))
    floor = min((f for f in floors if f), key=lambda f: f["median"], default=None)
    if floor:
        floor["medians_of_runs"] = [f["median"] for f in floors if f]
    meta = metadata(cfg_name, transports)
    meta["modes"] = modes
    meta["rounds"] = args.rounds
    meta["speed_probes_ms"] = probes
    meta["summary"] += speed_summary(probes, names, meta["rounds"])
    meta["wall_s"] = time.monotonic() - started
    meta["load_average_start"], meta["load_average_end"] = load, os.getloadavg()
    meta["summary"] += (f" Load average (1 min): {load[0]:.2f} at the start, "
                        f"{meta['load_average_end'][0]:.2f} at the end.")
    text = report.write(args.out, results, floor, meta, errors)
    print()
    print(text)
    print(f"\nWrote {os.path.join(args.out, 'results.json')}, results.md and ratios.png "
          f"({meta['wall_s']:.0f} s).")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
