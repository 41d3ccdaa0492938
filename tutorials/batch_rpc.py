"""Batch RPC processing with ``@torchrpc.functions.async_execution``.

A parameter server trains a small linear model with several trainers. Each
trainer computes gradients on its own data and sends them to the server; the
server applies ONE optimizer step per round, once every trainer's gradients
are in, and only then answers all of them with the new parameters.

Without async execution, each waiting trainer's call would occupy one of the
server's threads until the round is complete. With it, the server's function
returns a ``torch.futures.Future`` at once, the thread is free, and the
response goes out when the future completes. Here the server has a single
thread and serves any number of trainers.

Run it (from the repository root):

    .venv/bin/python tutorials/batch_rpc.py --trainers 3 --rounds 40

The script starts itself once per trainer; this process is the server.
"""

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
import warnings

import torch

import torchrpc as rpc

warnings.simplefilter("ignore")  # torch.jit deprecation notices

FEATURES = 8
TRUE_WEIGHTS = torch.linspace(-1.0, 1.0, FEATURES)


class BatchUpdateParameterServer:
    """Holds the model; applies the averaged gradients of a full round."""

    instance = None  # this worker's server, made by serve()

    def __init__(self, trainers, lr=0.1):
        self.model = torch.nn.Linear(FEATURES, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.trainers = trainers
        self.lock = threading.Lock()
        self.arrived = 0
        self.round_done = torch.futures.Future()
        self.rounds = 0

    def parameters(self):
        return [p.detach().clone() for p in self.model.parameters()]

    @staticmethod
    @rpc.functions.async_execution
    def update_and_fetch(grads):
        """Runs on the server for each trainer's gradients; returns a Future
        of the parameters after this round's step."""
        self = BatchUpdateParameterServer.instance
        with self.lock:
            for p, g in zip(self.model.parameters(), grads):
                p.grad = g / self.trainers if p.grad is None else p.grad + g / self.trainers
            self.arrived += 1
            this_round = self.round_done
            if self.arrived == self.trainers:  # the last one of the round steps
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.arrived = 0
                self.rounds += 1
                self.round_done = torch.futures.Future()
                this_round.set_result(self.parameters())
        return this_round


def initial_parameters():
    return BatchUpdateParameterServer.instance.parameters()


def train(rank, rounds, seed):
    """A trainer: its own data, gradients to the server, new parameters back."""
    torch.manual_seed(seed)
    x = torch.randn(256, FEATURES)
    y = x @ TRUE_WEIGHTS + 0.5 + 0.01 * torch.randn(256)
    model = torch.nn.Linear(FEATURES, 1)
    params = rpc.rpc_sync("server", initial_parameters)
    for step in range(rounds):
        with torch.no_grad():
            for p, new in zip(model.parameters(), params):
                p.copy_(new)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        params = rpc.rpc_sync("server", BatchUpdateParameterServer.update_and_fetch, args=(grads,))
        if step % max(1, rounds // 5) == 0 or step == rounds - 1:
            # one write per line: several trainers share the terminal
            sys.stdout.write(f"trainer{rank}: round {step:3d}  loss {loss.item():.4f}\n")
            sys.stdout.flush()


def options(port):
    return rpc.RpcOptions(init_method=f"tcp://127.0.0.1:{port}", num_worker_threads=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    world_size = args.trainers + 1

    if args.rank > 0:  # a trainer process started below
        rpc.init_rpc(f"trainer{args.rank}", rank=args.rank, world_size=world_size,
                     rpc_backend_options=options(args.port))
        train(args.rank, args.rounds, seed=args.rank)
        rpc.shutdown()
        return

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"server: starting {args.trainers} trainers; one SGD step per round of "
          f"{args.trainers} gradient updates, on ONE server thread", flush=True)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    trainers = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port),
                                  "--trainers", str(args.trainers), "--rounds", str(args.rounds)], env=env)
                for r in range(1, world_size)]
    server = BatchUpdateParameterServer.instance = BatchUpdateParameterServer(args.trainers)
    try:
        rpc.init_rpc("server", rank=0, world_size=world_size, rpc_backend_options=options(port))
        # serve (on torchrpc's threads) until the last round, or a trainer fails
        while server.rounds < args.rounds and all(t.poll() in (None, 0) for t in trainers):
            time.sleep(0.05)
        rpc.shutdown(graceful=server.rounds == args.rounds)
        for t in trainers:
            t.wait(timeout=60)
    finally:
        for t in trainers:
            if t.poll() is None:
                t.kill()
    w = server.model.weight.detach().squeeze(0)
    print(f"server: {server.rounds} rounds; weights {[round(v, 2) for v in w.tolist()]} "
          f"(true {[round(v, 2) for v in TRUE_WEIGHTS.tolist()]})")
    if any(t.returncode != 0 for t in trainers):
        sys.exit("a trainer failed")


if __name__ == "__main__":
    main()
