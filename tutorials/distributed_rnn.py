"""Model-parallel training with distributed autograd: an RNN split across two workers.

A parameter server ("ps") holds the model's two big pieces, the embedding
table and the decoder, as remote objects. The trainer holds the LSTM between
them. Each training step:

1. sends the input tokens to the embedding table on ps and gets embeddings back;
2. runs them through its local LSTM;
3. sends the LSTM's output to the decoder on ps and gets the logits back;
4. ``torchrpc.autograd.backward(context_id, [loss])`` runs the backward pass
   through all three pieces, across both workers;
5. ``DistributedOptimizer.step(context_id)`` updates the parameters where
   they live: the embedding and decoder on ps, the LSTM on the trainer.

The task is synthetic so that the loss visibly falls: every sequence counts
up through the vocabulary with its own stride (1, 2 or 3), and the model
learns to predict the next token.

What it shows:

- ``torchrpc.autograd.context()``, ``backward`` and ``get_gradients``-free
  training (the optimizer reads the context's gradients on each owner);
- ``torchrpc.optim.DistributedOptimizer`` over ``RRef``\\ s of parameters on
  several workers; with Adam, each owner steps without the GIL;
- ``rref.rpc_sync().method(...)`` calls on remote modules, recorded by
  distributed autograd like any other call.

Run it (from the repository root):

    .venv/bin/python tutorials/distributed_rnn.py --epochs 10
"""

import argparse
import os
import socket
import subprocess
import sys

import torch
import torch.nn as nn

import torchrpc

#: The RPC module the model uses. The benchmarks (benchmarks/scenarios.py) set
#: it to torch.distributed.rpc to time the same model on upstream.
rpc = torchrpc


def _parameter_rrefs(module):
    return [rpc.RRef(p) for p in module.parameters()]


class EmbeddingTable(nn.Module):
    """The input embedding: lives on the parameter server."""

    def __init__(self, ntoken, ninp):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)

    def forward(self, tokens):
        return self.encoder(tokens)

    def parameter_rrefs(self):
        return _parameter_rrefs(self)


class Decoder(nn.Module):
    """The output projection to token logits: lives on the parameter server."""

    def __init__(self, ntoken, nhid):
        super().__init__()
        self.decoder = nn.Linear(nhid, ntoken)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, output):
        return self.decoder(output)

    def parameter_rrefs(self):
        return _parameter_rrefs(self)


class RNNModel(nn.Module):
    """Embedding and decoder on worker `ps`, the LSTM here."""

    def __init__(self, ps, ntoken, ninp, nhid, nlayers):
        super().__init__()
        self.embedding = rpc.remote(ps, EmbeddingTable, args=(ntoken, ninp))
        self.rnn = nn.LSTM(ninp, nhid, nlayers)
        self.decoder = rpc.remote(ps, Decoder, args=(ntoken, nhid))

    def forward(self, tokens, hidden):
        emb = self.embedding.rpc_sync().forward(tokens)
        output, hidden = self.rnn(emb, hidden)
        return self.decoder.rpc_sync().forward(output), hidden

    def parameter_rrefs(self):
        return (self.embedding.rpc_sync().parameter_rrefs() + _parameter_rrefs(self.rnn)
                + self.decoder.rpc_sync().parameter_rrefs())


def batches(ntoken, seq_len, batch, count, generator):
    """`count` (input, target) pairs of shape (seq_len, batch): sequences that
    count up with a stride of 1, 2 or 3; the target is the next token."""
    for _ in range(count):
        start = torch.randint(ntoken, (1, batch), generator=generator)
        stride = torch.randint(1, 4, (1, batch), generator=generator)
        seq = (start + stride * torch.arange(seq_len + 1).unsqueeze(1)) % ntoken
        yield seq[:-1], seq[1:]


def train(args):
    torch.manual_seed(0)
    model = RNNModel("ps", args.ntoken, args.ninp, args.nhid, args.nlayers)
    opt = torchrpc.optim.DistributedOptimizer(torch.optim.Adam, model.parameter_rrefs(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    data = torch.Generator().manual_seed(1)
    for epoch in range(1, args.epochs + 1):
        total = 0.0
        for tokens, target in batches(args.ntoken, args.seq_len, args.batch, args.steps, data):
            hidden = (torch.zeros(args.nlayers, args.batch, args.nhid),
                      torch.zeros(args.nlayers, args.batch, args.nhid))
            with torchrpc.autograd.context() as context_id:
                logits, hidden = model(tokens, hidden)
                loss = criterion(logits.reshape(-1, args.ntoken), target.reshape(-1))
                torchrpc.autograd.backward(context_id, [loss])
                opt.step(context_id)  # no zero_grad: gradients live in the context
            total += loss.item()
        print(f"epoch {epoch:3d}  loss {total / args.steps:.3f}", flush=True)


def options(port):
    return torchrpc.RpcOptions(init_method=f"tcp://127.0.0.1:{port}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20, help="batches per epoch")
    parser.add_argument("--ntoken", type=int, default=50)
    parser.add_argument("--ninp", type=int, default=32)
    parser.add_argument("--nhid", type=int, default=64)
    parser.add_argument("--nlayers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=12)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--ps", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ps:  # the parameter server process started below: it only serves
        torchrpc.init_rpc("ps", rank=1, world_size=2, rpc_backend_options=options(args.port))
        torchrpc.shutdown()
        return

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ps = subprocess.Popen([sys.executable, __file__, "--ps", "--port", str(port)], env=env)
    try:
        torchrpc.init_rpc("trainer", rank=0, world_size=2, rpc_backend_options=options(port))
        train(args)
        torchrpc.shutdown()
        ps.wait(timeout=60)
    finally:
        if ps.poll() is None:
            ps.kill()
    if ps.returncode != 0:
        sys.exit("the parameter server failed")


if __name__ == "__main__":
    main()
