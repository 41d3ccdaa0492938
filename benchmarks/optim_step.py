"""Step time of the TorchScript functional optimizers vs torch.optim, one process.

The model is the tutorial's: an embedding 10000x128 and a linear 128->10000
(weight and bias), with dense float32 gradients. For each optimizer, both
implementations step the same gradients on separate copies of the
parameters; the two are timed alternately, call by call, so that load from
other processes on a shared machine hits both alike.

    .venv/bin/python benchmarks/optim_step.py              # table on stdout
    .venv/bin/python benchmarks/optim_step.py --json       # one JSON line per optimizer

Columns: median and p90 of one step (ms), the first functional step (the
TorchScript profiling run), and functional_optimizer() after its class is
compiled (it also constructs the torch optimizer once, to validate).
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._measure import summarize  # noqa: E402
from torchrpc.optim.functional import functional_optimizer  # noqa: E402

SHAPES = [(10000, 128), (10000, 128), (10000,)]
CASES = [
    (torch.optim.SGD, {"lr": 0.05}),
    (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    (torch.optim.Adam, {"lr": 1e-3}),
    (torch.optim.AdamW, {"lr": 1e-3}),
    (torch.optim.Adagrad, {"lr": 0.01}),
    (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.9}),
]


def _measure(optimizer_class, kwargs, n, warmup):
    grads = [torch.randn(s) * 1e-3 for s in SHAPES]
    ref_params = [torch.randn(s, requires_grad=True) for s in SHAPES]
    our_params = [p.detach().clone().requires_grad_() for p in ref_params]
    reference = optimizer_class(ref_params, **kwargs)
    for p, g in zip(ref_params, grads):
        p.grad = g
    functional_optimizer(optimizer_class, our_params, **kwargs)  # compiles the class
    start = time.perf_counter()
    functional = functional_optimizer(optimizer_class, our_params, **kwargs)
    factory = time.perf_counter() - start
    start = time.perf_counter()
    functional.step(grads)
    first = time.perf_counter() - start
    ours, theirs = [], []
    for i in range(warmup + n):
        start = time.perf_counter()
        reference.step()
        middle = time.perf_counter()
        functional.step(grads)
        end = time.perf_counter()
        if i >= warmup:
            theirs.append(middle - start)
            ours.append(end - middle)
    return {
        "optimizer": optimizer_class.__name__,
        "kwargs": kwargs,
        "torch_optim_s": summarize(theirs),
        "functional_s": summarize(ours),
        "functional_first_step_s": first,
        "factory_s": factory,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="timed steps per optimizer")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    if not args.json:
        print(f"load average {os.getloadavg()[0]:.2f}, torch threads {args.threads}")
        print(
            f"{'optimizer':32s} {'torch.optim ms p50/p90':>22s} "
            f"{'functional ms p50/p90':>22s} {'1st step ms':>11s} {'factory ms':>10s}"
        )
    for optimizer_class, kwargs in CASES:
        r = _measure(optimizer_class, kwargs, args.n, args.warmup)
        if args.json:
            print(json.dumps(r), flush=True)
            continue
        name = f"{r['optimizer']}({', '.join(f'{k}={v}' for k, v in kwargs.items())})"
        t, f = r["torch_optim_s"], r["functional_s"]
        print(
            f"{name:32s} {t['median'] * 1e3:10.2f}/{t['p90'] * 1e3:<11.2f} "
            f"{f['median'] * 1e3:10.2f}/{f['p90'] * 1e3:<11.2f} "
            f"{r['functional_first_step_s'] * 1e3:11.2f} {r['factory_s'] * 1e3:10.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
