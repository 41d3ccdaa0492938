"""DistributedDataParallel inside torchrpc's distributed autograd (upstream's
DDP + RPC pattern): trainers worker1 and worker2 wrap a local layer in DDP
(gloo, a group of two) and take their input from a layer on worker0 over RPC.

DDP's Reducer averages the gradients inside the backward pass; under torchrpc
the averaged gradients must be what the context holds, on both trainers, and
what DistributedOptimizer applies. The reference is torch's own local
autograd on the same step. Each trainer's inputs differ, so a trainer that
kept its own gradient (no averaging) fails the comparison."""

import pytest
import torch
from torch.testing import assert_close

import torchrpc as rpc
from tests.multiprocess import ddp_funcs as D
from tests.multiprocess.cluster import Cluster, free_port

TRAINERS = ("worker1", "worker2")


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3) as c:
        init_method = f"tcp://127.0.0.1:{free_port()}"
        started = [rpc.rpc_async(w, D.start_trainer, args=(rank, init_method)) for rank, w in enumerate(TRAINERS)]
        for f in started:
            f.wait()
        yield c
        for f in [rpc.rpc_async(w, D.stop_trainer) for w in TRAINERS]:
            f.wait()


def on_trainers(fn, *args):
    """Runs fn on both trainers at once (DDP's collectives need both)."""
    futures = [rpc.rpc_async(w, fn, args=args, timeout=60) for w in TRAINERS]
    return [f.wait() for f in futures]


def test_the_context_holds_the_gradients_ddp_averaged():
    for step in range(2):
        remote_params = D.remote_state()
        dist_results = on_trainers(D.dist_step, step)
        torch_results = on_trainers(D.torch_step, step, remote_params)
        # torch itself: both replicas hold the average, which is neither one's own gradient
        (averaged1, own1, _), (averaged2, own2, _) = torch_results
        for a1, a2, o1, o2 in zip(averaged1, averaged2, own1, own2):
            assert_close(a1, a2)
            assert_close(a1, (o1 + o2) / 2)
            assert not torch.allclose(o1, o2)
        # torchrpc: the context holds exactly that average, on both trainers
        for (mine, _), (averaged, _, _) in zip(dist_results, torch_results):
            assert len(mine) == len(averaged) == 2
            for got, want in zip(mine, averaged):
                assert got is not None
                assert_close(got, want)


def test_the_rpc_layer_gets_each_trainers_own_gradient():
    """worker0's layer is not DDP's: its gradient in each trainer's context is
    that trainer's own, as under torch."""
    remote_params = D.remote_state()
    dist_results = on_trainers(D.dist_step, 5)
    torch_results = on_trainers(D.torch_step, 5, remote_params)
    for (_, theirs), (_, _, want) in zip(dist_results, torch_results):
        for got, w in zip(theirs, want):
            assert_close(got, w)
    assert not torch.allclose(dist_results[0][1][0], dist_results[1][1][0])


def test_distributed_optimizer_keeps_the_replicas_equal():
    before = on_trainers(D.ddp_parameters)
    for a, b in zip(*before):
        assert_close(a, b)
    for step in range(3):
        after = on_trainers(D.optimizer_step, 10 + step)
        for a, b in zip(*after):
            assert_close(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(before[0], after[0]))
