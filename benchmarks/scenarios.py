"""The measurements, written once against an ``rpc`` module.

Each function takes ``rpc`` (torchrpc or torch.distributed.rpc, already
initialised unless the function initialises it itself), the callee's name and
``cfg`` (the run's sizes: see ``run_all.CONFIGS``), and returns plain data for
JSON. Times are medians of per-call samples unless said otherwise.
"""

import os
import statistics
import time

import torch

from benchmarks import _measure, exported_fns, remote_fns

#: rpc_sync latency: name -> (function, args). Tiny calls, so the RPC dominates.
LATENCY_CALLS = {
    "script": (remote_fns.tiny_script, (torch.ones(2),)),
    "builtin": (torch.add, (torch.ones(2), 1)),
    "python": (remote_fns.tiny_python, (torch.ones(2),)),
    "script_int": (remote_fns.int_script, (1,)),
    "python_int": (remote_fns.int_python, (1,)),
}

#: CPU-bound scaling: kind -> function.
BUSY_BY_KIND = {"script": remote_fns.busy_script, "python": remote_fns.busy_python}


def idle_cpu(callee_pid, cfg):
    """CPU used by the callee and by this (caller) process while both are idle.

    Call right after init_rpc and a first call (the connection is open).

    Returns:
        {"callee_pct": ..., "caller_pct": ...}: percent of one core.
    """
    time.sleep(0.2)  # let any post-activity spinning end
    me = os.getpid()
    pct = _measure.idle_cpu_percent([callee_pid, me], cfg["idle_s"])
    return {"callee_pct": pct[callee_pid], "caller_pct": pct[me], "seconds": cfg["idle_s"]}


def latency(rpc, to, cfg):
    """rpc_sync round trip of tiny calls, one at a time, the kinds in
    alternating blocks (the first kind measured alone after init_rpc read up
    to 1.4x its later time: benchmarks/HISTORY.md, 2026-11-28).

    Returns:
        {call name: summary of per-call µs}, names as in LATENCY_CALLS.
    """
    calls = {name: (lambda fn=fn, args=args: rpc.rpc_sync(to, fn, args=args))
             for name, (fn, args) in LATENCY_CALLS.items()}
    samples = _measure.time_interleaved(calls, cfg["latency_samples"], cfg["latency_warmup"])
    return {name: _measure.summarize([s * 1e6 for s in v]) for name, v in samples.items()}


def throughput(rpc, to, cfg):
    """Calls per second with N calls in flight: batches of N rpc_async, then
    wait for all of them; the median over a few rounds of fixed duration.
    For each N the kinds take turns, round by round (as latency's blocks), so
    that no kind is always the one measured first after a change of load.

    Returns:
        {kind: {str(N): calls/s}} for kind in script, builtin, python (the
        tiny calls of LATENCY_CALLS).
    """
    kinds = ("script", "builtin", "python")
    out = {kind: {} for kind in kinds}
    for depth in cfg["throughput_depths"]:
        batches = {kind: _batch(rpc, to, *LATENCY_CALLS[kind], depth) for kind in kinds}
        for batch in batches.values():
            for _ in range(max(1, 200 // depth)):  # warm-up
                batch()
        rates = {kind: [] for kind in kinds}
        for _ in range(cfg["throughput_rounds"]):
            for kind, batch in batches.items():
                rates[kind].append(_measure.rate_for(batch, cfg["throughput_round_s"]))
        for kind, samples in rates.items():
            out[kind][str(depth)] = statistics.median(samples)
    return out


def _batch(rpc, to, fn, args, depth):
    """One batch of `depth` rpc_async calls of fn(*args), waited for together; returns depth."""

    def batch():
        futures = [rpc.rpc_async(to, fn, args=args) for _ in range(depth)]
        torch.futures.wait_all(futures)
        return depth

    return batch


def tensor_send(rpc, to, cfg):
    """One-way tensor send: rpc_sync of a function that returns a 1-element
    tensor, with float32 arguments of each size in cfg["send_sizes"] (bytes).

    Returns:
        {str(bytes): {"ms": median ms per call, "mb_per_s": 10^6 bytes/s}}.
    """
    out = {}
    for size, reps in zip(cfg["send_sizes"], cfg["send_reps"]):
        x = torch.ones(size // 4)
        samples = _measure.time_each(lambda: rpc.rpc_sync(to, remote_fns.sink_script, args=(x,)),
                                     reps, max(2, reps // 10))
        median = statistics.median(samples)
        out[str(size)] = {"ms": median * 1e3, "mb_per_s": size / median / 1e6, "n": reps}
    return out


def script_caller(backend, to, cfg):
    """One tiny_script call issued from inside a TorchScript function, against
    the same call from eager Python: rpc_async(...).wait() and rpc_sync. The
    four are timed in alternating blocks: their ratios are the targets.

    Returns:
        {"eager": summary µs, "from_script": summary µs,
         "eager_sync": summary µs, "from_script_sync": summary µs}.
    """
    rpc, x = backend.rpc, torch.ones(2)
    if backend.name == "torchrpc":
        script_async, script_sync = remote_fns.torchrpc_script_caller, remote_fns.torchrpc_script_sync_caller
    else:
        script_async, script_sync = remote_fns.torch_script_caller, remote_fns.torch_script_sync_caller
    callers = {
        "eager": lambda: rpc.rpc_async(to, remote_fns.tiny_script, args=(x,)).wait(),
        "from_script": lambda: script_async(to, x),
        "eager_sync": lambda: rpc.rpc_sync(to, remote_fns.tiny_script, args=(x,)),
        "from_script_sync": lambda: script_sync(to, x),
    }
    samples = _measure.time_interleaved(callers, cfg["latency_samples"], cfg["latency_warmup"])
    return {key: _measure.summarize([s * 1e6 for s in v]) for key, v in samples.items()}


_UNSEEN_SOURCE = """
import torch

@torch.jit.script
def unseen(x: torch.Tensor) -> torch.Tensor:
    return x * {k} + 1
"""


def unseen_script_function(rpc, to, cfg):
    """torchrpc only: the first call of a TorchScript function the callee has
    never seen (its code is shipped and compiled there) against later calls.
    Each repetition makes a new function (new code, new hash) in a module
    only this process can import.

    Returns:
        {"first_ms": median of first calls, "later_us": median of later calls}.
    """
    import importlib.util
    import tempfile

    with tempfile.TemporaryDirectory(prefix="torchrpc-bench-") as folder:
        x = torch.ones(2)
        first, later = [], []
        for k in range(cfg["unseen_reps"]):
            path = os.path.join(folder, f"unseen_{k}.py")
            with open(path, "w") as f:
                f.write(_UNSEEN_SOURCE.format(k=k + 2))
            spec = importlib.util.spec_from_file_location(f"torchrpc_bench_unseen_{k}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            fn = module.unseen
            start = time.perf_counter()
            rpc.rpc_sync(to, fn, args=(x,))
            first.append(time.perf_counter() - start)
            later += _measure.time_each(lambda: rpc.rpc_sync(to, fn, args=(x,)), 50, 5)
    return {"first_ms": statistics.median(first) * 1e3, "later_us": statistics.median(later) * 1e6}


def exported_latency(rpc, to, folder, cfg):
    """torchrpc only: rpc_sync of the tiny exported program (exported_fns.Tiny,
    ``x + 1``) by the name the callee registered it under, and called
    directly (the ExportedProgram, by its package's hash), next to the same
    call as a TorchScript function and as a Python function, in alternating
    blocks (one phase of the machine for all four).

    Returns:
        {"exported", "exported_direct", "script", "python": summary µs}.
    """
    ep, args = exported_fns.load(folder, "tiny"), exported_fns.inputs("tiny")
    calls = {
        "exported": lambda: rpc.rpc_sync(to, exported_fns.NAMES["tiny"], args=args),
        "exported_direct": lambda: rpc.rpc_sync(to, ep, args=args),
        "script": lambda: rpc.rpc_sync(to, remote_fns.tiny_script, args=args),
        "python": lambda: rpc.rpc_sync(to, remote_fns.tiny_python, args=args),
    }
    samples = _measure.time_interleaved(calls, cfg["latency_samples"], cfg["latency_warmup"])
    return {key: _measure.summarize([s * 1e6 for s in v]) for key, v in samples.items()}


def exported_first_call(rpc, to, folder):
    """torchrpc only: what a fresh caller process pays for an exported
    program whose package is in the cache (exported_fns compiled it before
    the job): finding it there (torch.export.save and a hash of the
    program), then the first direct call, which ships the package to the
    callee (which lacks it) and loads it there.

    Returns:
        {"cache_hit_ms", "first_call_ms", "package_kb"}.
    """
    from torchrpc import exported

    ep, args = exported_fns.load(folder, "tiny"), exported_fns.inputs("tiny")
    start = time.perf_counter()
    path = exported.package(ep)
    hit = time.perf_counter() - start
    start = time.perf_counter()
    rpc.rpc_sync(to, ep, args=args)
    first = time.perf_counter() - start
    return {"cache_hit_ms": hit * 1e3, "first_call_ms": first * 1e3, "package_kb": os.path.getsize(path) / 1024}


def rrefs(rpc, to, cfg):
    """remote() + to_here() latency, to_here() of an existing RRef, a method
    call through rref.rpc_sync(), and creating and dropping many RRefs
    (callee memory and live owner RRefs before and after).

    Returns:
        {"remote_to_here_us": {kind: summary}, "to_here_us": summary,
         "proxy_us": summary, "churn": {...}}.
    """
    import gc

    x, n, warmup = torch.ones(2), cfg["rref_samples"], cfg["rref_samples"] // 10
    out = {"remote_to_here_us": {}}
    for kind in ("script", "builtin", "python"):
        fn, args = LATENCY_CALLS[kind]
        samples = _measure.time_each(lambda: rpc.remote(to, fn, args=args).to_here(), n, warmup)
        out["remote_to_here_us"][kind] = _measure.summarize([s * 1e6 for s in samples])
    rref = rpc.remote(to, remote_fns.tiny_script, args=(x,))
    samples = _measure.time_each(lambda: rref.to_here(), n, warmup)
    out["to_here_us"] = _measure.summarize([s * 1e6 for s in samples])
    counter = rpc.remote(to, remote_fns.Counter, args=(0,))
    samples = _measure.time_each(lambda: counter.rpc_sync().bump(1), n, warmup)
    out["proxy_us"] = _measure.summarize([s * 1e6 for s in samples])
    del rref, counter
    gc.collect()
    _settle(rpc, to, 0)  # the deletions reached the owner

    def owner_state():
        return (rpc.rpc_sync(to, remote_fns.rss_bytes), rpc.rpc_sync(to, remote_fns.owner_rref_count))

    rss_before, live_before = owner_state()
    start = time.perf_counter()
    _churn(rpc, to, x, cfg["rref_churn"])
    _settle(rpc, to, live_before)  # timed too: until the owner freed them
    churn_s = time.perf_counter() - start
    rss_after, live_after = owner_state()
    # A second churn shows a leak apart from the allocator's first growth.
    _churn(rpc, to, x, cfg["rref_churn"])
    _settle(rpc, to, live_before)
    rss_again, live_again = owner_state()
    out["churn"] = {"rrefs": cfg["rref_churn"], "seconds": churn_s,
                    "owner_rss_growth_mb": (rss_after - rss_before) / 1e6,
                    "owner_rss_growth_again_mb": (rss_again - rss_after) / 1e6,
                    "live_owner_rrefs_before": live_before,
                    "live_owner_rrefs_after": max(live_after, live_again)}
    return out


def _churn(rpc, to, x, count):
    """`count` RRefs created and dropped, in batches."""
    import gc

    for _ in range(count // 100):
        _create_and_drop(rpc, to, x, 100)
    gc.collect()


def _settle(rpc, to, live, timeout=5.0):
    """Returns once the owner holds at most `live` owner RRefs (the deletions
    reached it), or after `timeout` seconds (a leak: the report shows it)."""
    deadline = time.monotonic() + timeout
    while rpc.rpc_sync(to, remote_fns.owner_rref_count) > live and time.monotonic() < deadline:
        time.sleep(0.02)


def _create_and_drop(rpc, to, x, n):
    """n RRefs created, fetched, and dropped when this returns."""
    batch = [rpc.remote(to, remote_fns.tiny_script, args=(x,)) for _ in range(n)]
    for rref in batch:
        rref.to_here()


TRAIN_BLOCK = 20  # iterations per block of training(); see there


def serve_split_rnn(backend):
    """Points the tutorial's model at `backend`, in the process that serves
    SplitRnn's remote modules: the parameter RRefs they make are then this
    backend's."""
    from tutorials import distributed_rnn

    distributed_rnn.rpc = backend.rpc


class SplitRnn:
    """tutorials/distributed_rnn.py's split model on `backend` (embedding and
    decoder on worker `ps`, the LSTM here) with its DistributedOptimizer
    (`model`, `opt`), its local twin (`emb`, `lstm`, `dec` and `local_opt`:
    the same three modules in this process), both with SGD, and one batch:
    `tokens`, `hidden()` (fresh zero states) and `loss_of(logits)`."""

    def __init__(self, backend, ps, sz):
        from tutorials import distributed_rnn as rnn

        serve_split_rnn(backend)  # the tutorial's model on this backend, here too
        self.tokens, self._target = next(rnn.batches(sz["ntoken"], sz["seq_len"], sz["batch"], 1,
                                                     torch.Generator().manual_seed(0)))
        self._hidden_shape = (sz["nlayers"], sz["batch"], sz["nhid"])
        self._ntoken = sz["ntoken"]
        self._criterion = torch.nn.CrossEntropyLoss()
        torch.manual_seed(0)
        self.emb, self.dec = rnn.EmbeddingTable(sz["ntoken"], sz["ninp"]), rnn.Decoder(sz["ntoken"], sz["nhid"])
        self.lstm = torch.nn.LSTM(sz["ninp"], sz["nhid"], sz["nlayers"])
        self.local_opt = torch.optim.SGD([*self.emb.parameters(), *self.lstm.parameters(), *self.dec.parameters()],
                                         lr=0.01)
        self.model = rnn.RNNModel(ps, sz["ntoken"], sz["ninp"], sz["nhid"], sz["nlayers"])
        self.opt = backend.optim.DistributedOptimizer(torch.optim.SGD, self.model.parameter_rrefs(), lr=0.01)

    def hidden(self):
        return torch.zeros(self._hidden_shape), torch.zeros(self._hidden_shape)

    def loss_of(self, logits):
        return self._criterion(logits.reshape(-1, self._ntoken), self._target.reshape(-1))


def training(backend, ps, cfg):
    """One training iteration of tutorials/distributed_rnn.py's split model
    (embedding and decoder on `ps`, the LSTM here; SGD), against the same
    three modules trained in this process alone.

    The local and the distributed iterations run in alternating blocks of
    TRAIN_BLOCK, so that both see the same phases of a noisy machine (its
    speed drifts by 10-30% within seconds); the first iteration of each
    distributed block (its peer idle for the length of a local block) counts.

    Returns:
        {"local_ms", "iteration_ms", "forward_ms", "backward_ms", "step_ms":
         summaries of per-iteration ms; "sizes": the model's sizes}.
    """
    n, warmup = cfg["train_iterations"], cfg["train_iterations"] // 10
    m = SplitRnn(backend, ps, cfg["rnn"])
    tokens, hidden, loss_of = m.tokens, m.hidden, m.loss_of

    def local_iteration():
        m.local_opt.zero_grad()
        out, _ = m.lstm(m.emb(tokens), hidden())
        loss_of(m.dec(out)).backward()
        m.local_opt.step()

    def distributed_iteration():
        """Seconds of (forward, backward, step, iteration)."""
        t0 = time.perf_counter()
        with backend.autograd.context() as ctx:
            logits, _ = m.model(tokens, hidden())
            loss = loss_of(logits)
            t1 = time.perf_counter()
            backend.autograd.backward(ctx, [loss])
            t2 = time.perf_counter()
            m.opt.step(ctx)
            t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t0

    for _ in range(warmup):
        local_iteration()
        distributed_iteration()
    local = []
    phases = {"forward": [], "backward": [], "step": [], "iteration": []}
    for start in range(0, n, TRAIN_BLOCK):
        count = min(TRAIN_BLOCK, n - start)
        local += _measure.time_each(local_iteration, count, 0)
        for _ in range(count):
            for key, dt in zip(phases, distributed_iteration()):
                phases[key].append(dt)
    out = {f"{k}_ms": _measure.summarize([s * 1e3 for s in v]) for k, v in phases.items()}
    out["local_ms"] = _measure.summarize([s * 1e3 for s in local])
    out["sizes"] = cfg["rnn"]
    return out


def cpu_bound(rpc, to, control, index, callers, cfg, calls=None):
    """Scaling of a CPU-bound callee (a few ms per call) from 1 to `callers`
    concurrent callers, each a separate process calling rpc_sync back to back.
    `calls`: {kind: (function or name, args)}, by default BUSY_BY_KIND's.

    Every caller process runs this; they meet at control barriers. Caller 0
    measures alone, then all callers together, cfg["cpu_rounds"] times. The
    machine's speed drifts by 10-30% within seconds, so the scaling is the
    median of each round's ratio (the two windows of a round are adjacent),
    not a ratio of medians taken over the whole run.

    Returns (on caller 0; {} elsewhere):
        {kind: {"one": calls/s, "all": calls/s summed over callers (medians),
                "scaling": median of the rounds' all / one,
                "ms_per_call": ms with one caller}}.
    """
    out = {}
    if calls is None:
        calls = {kind: (fn, (remote_fns.BUSY_ITERS,)) for kind, fn in BUSY_BY_KIND.items()}
    for kind, (fn, args) in calls.items():
        def call():
            rpc.rpc_sync(to, fn, args=args)
            return 1

        for _ in range(3):
            call()
        one, together = [], []
        for r in range(cfg["cpu_rounds"]):
            control.barrier(f"cpu/{kind}/{r}/one", callers)
            if index == 0:
                one.append(_measure.rate_for(call, cfg["cpu_round_s"]))
            control.barrier(f"cpu/{kind}/{r}/all", callers)
            control.set(f"cpu/{kind}/{r}/rate/{index}", repr(_measure.rate_for(call, cfg["cpu_round_s"])))
            if index == 0:
                together.append(sum(float(control.get(f"cpu/{kind}/{r}/rate/{i}")) for i in range(callers)))
        if index == 0:
            one_rate, all_rate = statistics.median(one), statistics.median(together)
            scaling = statistics.median(a / o for a, o in zip(together, one))
            out[kind] = {"one": one_rate, "all": all_rate, "scaling": scaling,
                         "ms_per_call": 1e3 / one_rate}
    return out


def init_shutdown(backend, name, rank, world_size, ports, control, cfg):
    """Time of init_rpc and of shutdown in this worker, once per port in `ports`.

    All workers of the job start each init_rpc together (a control barrier),
    so process start-up and imports are not counted, and meet again before
    shutdown.

    Returns:
        {"init_s": [...], "shutdown_s": [...]}, one entry per repetition.
    """
    rpc = backend.rpc
    init_s, shutdown_s = [], []
    for rep, port in enumerate(ports):
        kwargs = backend.init_kwargs(port, cfg["threads"], cfg["rpc_timeout"])
        control.barrier(f"init/{rep}")
        start = time.perf_counter()
        rpc.init_rpc(name, rank=rank, world_size=world_size, **kwargs)
        init_s.append(time.perf_counter() - start)
        control.barrier(f"up/{rep}")
        start = time.perf_counter()
        rpc.shutdown()
        shutdown_s.append(time.perf_counter() - start)
    return {"init_s": init_s, "shutdown_s": shutdown_s}
