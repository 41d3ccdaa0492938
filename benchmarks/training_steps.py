"""Where a split-RNN training iteration spends its time, step by step.

    .venv/bin/python benchmarks/training_steps.py [--backend torchrpc|torch|backend]
        [--iterations 400] [--threads 1]

The model and sizes of run_all's ``training`` job (tutorials/distributed_rnn.py:
embedding and decoder on the parameter server, the LSTM on the trainer). Each
distributed iteration is followed by its local twin (the same three modules in
this process), so both see the same phases of the machine; then a tiny builtin
call. Prints the median µs of each step of both, and of the calls made in a
row right after the forward (an RPC that follows compute is a cold call: the
threads it crosses have slept). Not part of run_all; one backend per run.
"""

import argparse
import os
import socket
import statistics
import sys
import time

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import backends, run_all, scenarios  # noqa: E402

WARMUP = 50


class Steps:
    """Median µs per named step; `mark(name)` ends the step begun at the last mark."""

    def __init__(self):
        self.samples, self._last = {}, None

    def start(self):
        self._last = time.perf_counter()

    def mark(self, name, keep):
        now = time.perf_counter()
        if keep:
            self.samples.setdefault(name, []).append((now - self._last) * 1e6)
        self._last = now

    def line(self, label):
        medians = {k: statistics.median(v) for k, v in self.samples.items()}
        steps = "  ".join(f"{k} {v:.0f}" for k, v in medians.items())
        return f"{label:12s} {steps}  (sum {sum(medians.values()):.0f} µs)"


def trainer(backend, iterations):
    m = scenarios.SplitRnn(backend, "ps", run_all.CONFIGS["full"]["rnn"])
    model, tokens, hidden, loss_of = m.model, m.tokens, m.hidden, m.loss_of
    dist, local, calls = Steps(), Steps(), Steps()
    x = torch.ones(2)
    for i in range(iterations + WARMUP):
        keep = i >= WARMUP
        dist.start()
        with backend.autograd.context() as ctx:
            out = model.embedding.rpc_sync().forward(tokens)
            dist.mark("embedding", keep)
            out, _ = model.rnn(out, hidden())
            dist.mark("lstm", keep)
            calls.start()  # calls in a row, right after compute
            backend.rpc.rpc_sync("ps", torch.add, args=(x, 1))
            calls.mark("builtin after compute", keep)
            backend.rpc.rpc_sync("ps", torch.add, args=(x, 1))
            calls.mark("builtin again", keep)
            dist.start()
            loss = loss_of(model.decoder.rpc_sync().forward(out))
            dist.mark("decoder+loss", keep)
            backend.autograd.backward(ctx, [loss])
            dist.mark("backward", keep)
            m.opt.step(ctx)
            dist.mark("step", keep)
        dist.mark("context exit", keep)
        local.start()
        m.local_opt.zero_grad()
        out = m.emb(tokens)
        local.mark("embedding", keep)
        out, _ = m.lstm(out, hidden())
        local.mark("lstm", keep)
        loss = loss_of(m.dec(out))
        local.mark("decoder+loss", keep)
        loss.backward()
        local.mark("backward", keep)
        m.local_opt.step()
        local.mark("step", keep)
    print(dist.line("distributed"))
    print(local.line("local"))
    print(calls.line("calls"))


def worker(rank, name, port, iterations, threads):
    torch.set_num_threads(threads)
    backend = backends.load(name)
    if rank == 1:  # the parameter server
        scenarios.serve_split_rnn(backend)
    kwargs = backend.init_kwargs(port, num_worker_threads=16, rpc_timeout=60)
    backend.rpc.init_rpc(["trainer", "ps"][rank], rank=rank, world_size=2, **kwargs)
    if rank == 0:
        trainer(backend, iterations)
    backend.rpc.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="torchrpc", choices=backends.NAMES)
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in both processes")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(args.backend, port, args.iterations, args.threads), nprocs=2)


if __name__ == "__main__":
    main()
