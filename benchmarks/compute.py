"""Scenarios about compute next to RPC: a callee that runs a network inside
its calls, and a compute loop in a process beside a job's workers.

Both use remote_fns.SmallCNN with torch's own intra-op thread setting in
every process (no torch.set_num_threads): the compute is what a user's
would be, and the RPC library must not slow it down.
"""

import statistics
import time

import torch

from benchmarks import _measure, remote_fns

COMPUTE_BLOCK = 10  # calls per block of callee(): see there

#: The phases of beside(), in the order they run; each is a window of the
#: compute loop, measured cfg["beside_rounds"] times.
BESIDE_PHASES = ("alone_before", "idle", "calls", "alone_after")
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


def _loop_rate(cfg):
    """CNN forward passes per second in this process: the median of
    cfg["beside_rounds"] windows of cfg["beside_window_s"]."""
    x = remote_fns.cnn_input()

    def step():
        remote_fns.cnn_forward(x)
        return 1

    step()
    return statistics.median(_measure.rate_for(step, cfg["beside_window_s"]) for _ in range(cfg["beside_rounds"]))


def beside(role, backend, control, init, cfg):
    """A compute loop in a process of its own (the "loop" role), beside the
    two workers of a job (roles "callee" and "caller"), in four phases that
    meet at control barriers:

    - alone_before: the workers' processes have imported torch, and wait
      before init_rpc;
    - idle: both workers initialised, connected, after 200 calls, now waiting;
    - calls: the caller makes a tiny call every BESIDE_CALL_PERIOD_S;
    - alone_after: both workers have shut down (their processes wait to exit).

    `init(name)` initialises this process's worker (the job's _init). Every
    role runs this.

    Returns (on the loop; {} elsewhere):
        {"rates": {phase: forward passes/s}, "idle": idle / alone,
         "calls": calls / alone}, alone being the mean of the two alone phases.
    """
    rpc, worker = backend.rpc, role in ("callee", "caller")
    rates = {}
    control.barrier("beside/start")  # every process has imported torch
    if role == "loop":
        rates["alone_before"] = _loop_rate(cfg)
    control.barrier("beside/alone_before")
    if worker:
        init(role)
    else:
        control.barrier("ready")  # the workers' init barrier counts every process
    if role == "caller":
        fn, args = remote_fns.tiny_script, (torch.ones(2),)
        for _ in range(200):
            rpc.rpc_sync("callee", fn, args=args)
    control.barrier("beside/idle")
    if role == "loop":
        rates["idle"] = _loop_rate(cfg)
    control.barrier("beside/calls")
    if role == "loop":
        rates["calls"] = _loop_rate(cfg)
        control.set("beside/calls_done", "1")
    elif role == "caller":
        while not control.is_set("beside/calls_done"):
            rpc.rpc_sync("callee", fn, args=args)
            time.sleep(BESIDE_CALL_PERIOD_S)
    control.barrier("beside/down")
    if worker:
        rpc.shutdown()
    control.barrier("beside/alone_after")
    if role == "loop":
        rates["alone_after"] = _loop_rate(cfg)
    control.barrier("beside/end")  # the workers exit only now: exiting takes CPU
    if role != "loop":
        return {}
    alone = (rates["alone_before"] + rates["alone_after"]) / 2
    return {"rates": rates, "idle": rates["idle"] / alone, "calls": rates["calls"] / alone}
