"""Scenarios about compute next to RPC: a callee that runs a network inside
its calls, and a compute loop in a process beside a job's workers.

Both use remote_fns.SmallCNN with torch's own intra-op thread setting in
every process (no torch.set_num_threads): the compute is what a user's
would be, and the RPC library must not slow it down.
"""

import os
import signal
import statistics
import time

import torch

from benchmarks import _measure, remote_fns

COMPUTE_BLOCK = 10  # calls per block of callee(): see there

#: The phases of beside(): the workers idle, then calling now and then.
BESIDE_PHASES = ("idle", "calls")
#: How often the caller calls in the "calls" phase.
BESIDE_CALL_PERIOD_S = 0.005


def callee(rpc, to, cfg):
    """rpc_sync(to, cnn_forward, (x,)): the callee runs the CNN's forward pass
    on a batch of 16 images inside the call, against the same forward pass in
    this process, in alternating blocks of COMPUTE_BLOCK (both see the same
    phases of the machine).

    Returns:
        {"remote_ms": summary, "local_ms": summary}.
    """
    x = remote_fns.cnn_input()
    fns = {"remote": lambda: rpc.rpc_sync(to, remote_fns.cnn_forward, args=(x,)),
           "local": lambda: remote_fns.cnn_forward(x)}
    n = cfg["compute_calls"]
    samples = _measure.time_interleaved(fns, n, max(2, n // 10), block=COMPUTE_BLOCK)
    return {f"{key}_ms": _measure.summarize([s * 1e3 for s in v]) for key, v in samples.items()}


def _against_stopped(pids, cfg):
    """CNN forward passes per second in this process, with the workers
    `pids` running and with them stopped (SIGSTOP: the machine as if they
    were gone), in windows of cfg["beside_window_s"] in the order stopped,
    running, running, stopped, cfg["beside_rounds"] times: a ratio within a
    round sees one phase of the machine, and its drift cancels.

    Returns:
        {"running": passes/s, "stopped": passes/s (medians of the windows),
         "rounds": each round's running / stopped, "ratio": their median}.
    """
    x = remote_fns.cnn_input()

    def step():
        remote_fns.cnn_forward(x)
        return 1

    def window(stop):
        if not stop:
            return _measure.rate_for(step, cfg["beside_window_s"])
        try:
            for pid in pids:
                _measure.stop_process(pid)
            return _measure.rate_for(step, cfg["beside_window_s"])
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)

    step()
    running, stopped, ratios = [], [], []
    for _ in range(cfg["beside_rounds"]):
        rates = [window(stop) for stop in (True, False, False, True)]
        stopped += [rates[0], rates[3]]
        running += rates[1:3]
        ratios.append((rates[1] + rates[2]) / (rates[0] + rates[3]))
    return {"running": statistics.median(running), "stopped": statistics.median(stopped),
            "ratio": statistics.median(ratios), "rounds": ratios}


def beside(role, backend, control, init, cfg):
    """A compute loop in a process of its own (the "loop" role), beside the
    two workers of a job (roles "callee" and "caller"), in two phases that
    meet at control barriers:

    - idle: both workers initialised, connected, after 200 calls, now waiting;
    - calls: the caller makes a tiny call every BESIDE_CALL_PERIOD_S.

    In each phase the loop compares its speed with the workers running and
    with them stopped (_against_stopped). `init(name)` initialises this
    process's worker (the job's _init). Every role runs this.

    Returns (on the loop; {} elsewhere):
        {phase: _against_stopped's result, for each of BESIDE_PHASES}.
    """
    rpc, worker = backend.rpc, role in ("callee", "caller")
    if worker:
        control.set(f"beside/pid/{role}", str(os.getpid()))
    control.barrier("beside/start")  # every process has imported torch
    if worker:
        init(role)
    else:
        control.barrier("ready")  # the workers' init barrier counts every process
    if role == "caller":
        fn, args = remote_fns.tiny_script, (torch.ones(2),)
        for _ in range(200):
            rpc.rpc_sync("callee", fn, args=args)
    pids = [int(control.get(f"beside/pid/{r}")) for r in ("callee", "caller")] if role == "loop" else []
    result = {}
    control.barrier("beside/idle")
    if role == "loop":
        result["idle"] = _against_stopped(pids, cfg)
    control.barrier("beside/calls")
    if role == "loop":
        result["calls"] = _against_stopped(pids, cfg)
        control.set("beside/calls_done", "1")
    elif role == "caller":
        while not control.is_set("beside/calls_done"):
            rpc.rpc_sync("callee", fn, args=args)
            time.sleep(BESIDE_CALL_PERIOD_S)
    control.barrier("beside/down")
    if worker:
        rpc.shutdown()
    control.barrier("beside/end")  # the workers exit only now: exiting takes CPU
    return result
