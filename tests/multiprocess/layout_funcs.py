"""Remote functions of test_layouts.py: what a callee sees of the tensors it
is sent (layout, strides, memory), and an embedding parameter server with
sparse gradients."""

from typing import List

import torch

import torchrpc as rpc


def components(t):
    """A sparse tensor's components, as the wire sends them."""
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    return [t.ccol_indices(), t.row_indices(), t.values()]


def describe(t):
    """What a user can see of a tensor's layout, and the bytes of memory it holds."""
    if t.layout == torch.strided:
        return {"layout": str(t.layout), "shape": tuple(t.shape), "stride": t.stride(),
                "bytes": t.untyped_storage().nbytes(), "contiguous": t.is_contiguous()}
    parts = components(t)
    return {"layout": str(t.layout), "shape": tuple(t.shape), "dtype": str(t.dtype),
            "coalesced": t.is_coalesced() if t.layout == torch.sparse_coo else None,
            "components": [(str(p.dtype), tuple(p.shape)) for p in parts],
            "bytes": sum(p.untyped_storage().nbytes() for p in parts)}


def describe_rref(rref):
    return describe(rref.to_here())


def echo(x):
    return x


def scaled(x, k):
    return x * k


@torch.jit.script
def script_scaled(x: torch.Tensor, k: float) -> torch.Tensor:
    return x * k


@torch.jit.script
def script_strides(x: torch.Tensor) -> List[int]:
    return x.stride()


class EmbeddingServer:
    """A parameter server's table: an nn.Embedding with sparse gradients, made from a seed."""

    def __init__(self, seed, rows, dim):
        self.emb = torch.nn.Embedding(rows, dim, sparse=True)
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)))

    def forward(self, ids):
        return self.emb(ids)

    def param_rrefs(self):
        return [rpc.RRef(p) for p in self.emb.parameters()]

    def weight(self):
        return self.emb.weight.detach().clone()

    def gradient(self, context_id):
        """This table's gradient in a distributed autograd context (sparse)."""
        return rpc.autograd.get_gradients(context_id)[self.emb.weight]


def on_meta(shape):
    """A tensor on no CPU (torch's meta device, which every build has): what a
    CUDA tensor is to a transport that sends CPU tensors only."""
    return torch.empty(shape, device="meta")


def bump_second(a, b):
    """Adds 100 to `b` in place and returns `a`: shows whether they share memory."""
    b.add_(100)
    return a


@torch.jit.script
def script_bump_second(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    b.add_(100)
    return a


def with_view(n):
    """A tensor and a view of it."""
    x = torch.arange(float(n))
    return x, x[1:3]
