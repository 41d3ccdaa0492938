"""Starts a job of benchmark worker processes and always cleans them up.

Each worker is ``python -m benchmarks.worker`` with its output in a log file,
started in one of two launch modes (:data:`MODES`): in this session, each in
its own process group, as torchrun starts workers; or each in its own
session, as separate terminals, services or containers start them (the
kernel's autogroup scheduling then gives each session its own share of the
CPU). :func:`run_job` waits with a deadline,
fails fast when a worker fails, and kills whatever is still running on the
way out, on success, error or Ctrl-C alike.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class JobFailed(RuntimeError):
    """A worker exited with an error, or the job ran past its deadline."""


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


#: Launch modes: mode -> Popen keywords. Either way a worker is a process
#: group of its own, killed as one.
MODES = {"one": {"process_group": 0}, "separate": {"start_new_session": True}}
#: Their labels in the report.
MODE_LABELS = {"one": "one session", "separate": "separate sessions"}


def _kill(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker's own session only
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_job(job, backend, world_size, control_port, cfg, timeout, ports=None, torch_transports=None, mode="one",
            round_index=0):
    """Runs benchmark job `job` on `backend` with `world_size` worker processes.

    Args:
        job (str): a key of benchmarks.worker.JOBS.
        backend (str): a key of benchmarks.backends.NAMES.
        world_size (int): number of worker processes.
        control_port (int): port of the run's control TCPStore.
        cfg (dict): the run's sizes, passed to the scenarios.
        timeout (float): seconds the whole job may take.
        ports (list of int): rendezvous ports, one per init_rpc (default: one fresh port).
        torch_transports (list of str): TensorPipe transports, None for its default.
        mode (str): launch mode, a key of MODES.
        round_index (int): which run of this job on this backend in this mode
            (run_all --rounds): each has its own keys in the control store.

    Returns:
        list: each rank's result dict, by rank.

    Raises:
        JobFailed: with the log tail of the worker that failed or hung.
    """
    with tempfile.TemporaryDirectory(prefix=f"bench-{mode}-{backend}-{job}-") as tmp:
        spec = {
            "job": job, "backend": backend, "world_size": world_size,
            "ports": ports or [free_port()], "control_port": control_port,
            "prefix": f"{mode}/{backend}/{job}/{world_size}/{round_index}", "timeout": timeout, "cfg": cfg,
            "torch_transports": torch_transports, "out_dir": tmp,
        }
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        procs, logs = [], []
        try:
            for rank in range(world_size):
                logs.append(os.path.join(tmp, f"rank{rank}.log"))
                with open(logs[-1], "w") as log:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "benchmarks.worker", "--spec", spec_path, "--rank", str(rank)],
                        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, **MODES[mode]))
            _wait_all(procs, logs, time.monotonic() + timeout, f"{backend}/{job}")
            results = []
            for rank in range(world_size):
                with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                    results.append(json.load(f))
            return results
        finally:
            for proc in procs:
                _kill(proc)


def _wait_all(procs, logs, deadline, what):
    while True:
        codes = [p.poll() for p in procs]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            raise JobFailed(f"{what}: rank {failed[0]} exited with {codes[failed[0]]}\n{_tails(logs)}")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            stuck = [rank for rank, code in enumerate(codes) if code is None]
            raise JobFailed(f"{what}: ranks {stuck} still running at the deadline\n{_tails(logs)}")
        time.sleep(0.05)


def _tails(logs):
    return "\n".join(f"--- rank {rank} log ends:\n{_tail(path)}" for rank, path in enumerate(logs))
