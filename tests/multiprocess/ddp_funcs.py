"""Remote functions of the DDP tests (test_ddp.py): trainers worker1 and
worker2 form a gloo process group of two and train a DDP-wrapped local layer
whose input comes from a layer on worker0, over RPC (upstream's DDP + RPC
pattern). Each trainer computes the same step twice: under torchrpc's
distributed autograd, and under torch's local autograd on local copies of
worker0's layer (the reference: what DDP averages under torch)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchrpc as rpc

_remote = {}  # worker0's layer, by name
_trainer = {}  # this trainer's DDP model and optimizer


def _remote_layer():
    if "layer" not in _remote:
        torch.manual_seed(7)
        _remote["layer"] = nn.Linear(4, 3, dtype=torch.float64)
    return _remote["layer"]


def remote_forward(x):
    """On worker0: the layer before the DDP part."""
    return torch.tanh(_remote_layer()(x))


def remote_state():
    """worker0's layer's parameters, for the reference computation."""
    return [p.detach().clone() for p in _remote_layer().parameters()]


def remote_param_rrefs():
    return [rpc.RRef(p) for p in _remote_layer().parameters()]


def remote_gradients(context_id):
    grads = rpc.autograd.get_gradients(context_id)
    return [grads.get(p) for p in _remote_layer().parameters()]


def start_trainer(rank, init_method):
    """Joins the trainers' gloo group and builds the DDP model; every trainer
    starts from the same weights (DDP broadcasts rank 0's)."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=2)
    torch.manual_seed(100 + rank)  # different weights before DDP's broadcast, different inputs
    local = nn.Linear(3, 2, dtype=torch.float64)
    _trainer["ddp"] = DistributedDataParallel(local)
    _trainer["rank"] = rank


def stop_trainer():
    _trainer.clear()
    dist.destroy_process_group()


def _inputs(step):
    g = torch.Generator().manual_seed(1000 * _trainer["rank"] + step)
    return torch.randn(5, 4, generator=g, dtype=torch.float64)


def _loss(y):
    return (y ** 2).sum()


def ddp_parameters():
    return [p.detach().clone() for p in _trainer["ddp"].module.parameters()]


def dist_step(step):
    """One step under distributed autograd: returns this trainer's gradients
    of the DDP parameters in the context, and of worker0's layer."""
    ddp = _trainer["ddp"]
    with rpc.autograd.context() as ctx:
        h = rpc.rpc_sync("worker0", remote_forward, args=(_inputs(step),))
        rpc.autograd.backward(ctx, [_loss(ddp(h))])
        grads = rpc.autograd.get_gradients(ctx)
        mine = [grads.get(p) for p in ddp.module.parameters()]
        theirs = rpc.rpc_sync("worker0", remote_gradients, args=(ctx,))
    return mine, theirs


def torch_step(step, remote_params):
    """The same step under torch's local autograd, worker0's layer copied
    here. Returns DDP's averaged gradients (.grad), this trainer's own
    gradients before averaging (the same computation without DDP), and the
    gradients of the copy of worker0's layer (DDP leaves those alone)."""
    ddp = _trainer["ddp"]
    copies = [p.clone().requires_grad_() for p in remote_params]
    h = torch.tanh(_inputs(step) @ copies[0].t() + copies[1])
    ddp.zero_grad()
    _loss(ddp(h)).backward()
    averaged = [p.grad.clone() for p in ddp.module.parameters()]
    own = torch.autograd.grad(_loss(ddp.module(h.detach())), list(ddp.module.parameters()))
    ddp.zero_grad()
    return averaged, list(own), [c.grad for c in copies]


def optimizer_step(step):
    """A DistributedOptimizer step from distributed autograd's gradients."""
    ddp = _trainer["ddp"]
    if "opt" not in _trainer:
        params = [rpc.RRef(p) for p in ddp.module.parameters()]
        _trainer["opt"] = rpc.optim.DistributedOptimizer(torch.optim.SGD, params, lr=0.1)
    with rpc.autograd.context() as ctx:
        h = rpc.rpc_sync("worker0", remote_forward, args=(_inputs(step),))
        rpc.autograd.backward(ctx, [_loss(ddp(h))])
        _trainer["opt"].step(ctx)
    return ddp_parameters()
