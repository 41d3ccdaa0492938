"""DistributedOptimizer against a 3-worker job: parameters on three workers
(this one included) step exactly like the same model under a local
torch.optim optimizer; SGD/Adam/Adagrad step without the GIL on their owner;
concurrent steps from several trainers all apply."""

import threading

import pytest
import torch
from torch.testing import assert_close

import torchrpc as rpc
from tests.multiprocess import autograd_funcs as P
from tests.multiprocess import funcs
from tests.multiprocess.cluster import Cluster


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3) as c:
        yield c


def x_input(step):
    return torch.randn(4, 3, generator=torch.Generator().manual_seed(50 + step), dtype=torch.float64)


def three_parts():
    return P.Part(0), rpc.remote("worker1", P.Part, args=(1,)), rpc.remote("worker2", P.Part, args=(2,))


@pytest.mark.parametrize("optimizer_class, kwargs, functional", [
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True), True),
    (torch.optim.Adam, dict(lr=0.05, amsgrad=True), True),
    (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01), True),
    (torch.optim.AdamW, dict(lr=0.05), True),
    (torch.optim.RMSprop, dict(lr=0.01, centered=True), True),
    (torch.optim.Rprop, dict(lr=0.01), False),  # no functional version: Python on the owner
])
def test_steps_equal_a_local_optimizer(optimizer_class, kwargs, functional):
    mine, on1, on2 = three_parts()
    ref = [P.Part(0), P.Part(1), P.Part(2)]
    params = mine.param_rrefs() + on1.rpc_sync().param_rrefs() + on2.rpc_sync().param_rrefs()
    opt = rpc.optim.DistributedOptimizer(optimizer_class, params, **kwargs)
    assert [fid is not None for fid in opt._functional_ids] == [functional] * 3
    ref_opt = optimizer_class([p for part in ref for p in part.parameters()], **kwargs)
    for step in range(3):
        with rpc.autograd.context() as ctx:
            y = on2.rpc_sync().forward(mine.forward(on1.rpc_sync().forward(x_input(step))))
            rpc.autograd.backward(ctx, [(y ** 2).sum()])
            opt.step(ctx)
        ref_opt.zero_grad()
        (ref[2].forward(ref[0].forward(ref[1].forward(x_input(step)))) ** 2).sum().backward()
        ref_opt.step()
    for got, want in zip([mine.values(), on1.rpc_sync().values(), on2.rpc_sync().values()], ref):
        for g, w in zip(got, want.values()):
            assert_close(g, w)


def test_the_functional_step_runs_while_the_owner_holds_the_gil():
    part = rpc.remote("worker1", P.Part, args=(1,))
    opt = rpc.optim.DistributedOptimizer(torch.optim.SGD, part.rpc_sync().param_rrefs(), lr=0.5)
    before = part.rpc_sync().values()
    c = torch.full((3, 3), 2.0, dtype=torch.float64)
    with rpc.autograd.context() as ctx:
        loss = part.rpc_sync().weighted_sum(c)
        rpc.autograd.backward(ctx, [loss])
        opt.step(ctx)  # the first step compiles; later ones are what we time
        with funcs.gil_held_on("worker1", "the steps"):
            for _ in range(5):
                opt.step(ctx)
    after = part.rpc_sync().values()
    assert_close(after[0], before[0] - 6 * 0.5 * c)
    assert_close(after[1], before[1] - 6 * 0.5 * torch.ones(3, dtype=torch.float64))


def test_concurrent_trainers_all_apply():
    part = rpc.remote("worker1", P.Part, args=(1,))
    before = part.rpc_sync().values()
    opt = rpc.optim.DistributedOptimizer(torch.optim.SGD, part.rpc_sync().param_rrefs(), lr=0.01)
    failures = []

    def trainer(k):
        try:
            for _ in range(10):
                with rpc.autograd.context() as ctx:
                    c = torch.full((3, 3), float(k), dtype=torch.float64)
                    rpc.autograd.backward(ctx, [part.rpc_sync().weighted_sum(c)])
                    opt.step(ctx)
        except Exception as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=trainer, args=(k,)) for k in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not failures, failures
    after = part.rpc_sync().values()
    assert_close(after[0], before[0] - 0.01 * 10 * (1 + 2 + 3) * torch.ones(3, 3, dtype=torch.float64))
    assert_close(after[1], before[1] - 0.01 * 30 * torch.ones(3, dtype=torch.float64))


def test_bad_arguments_fail_at_construction():
    part = rpc.remote("worker1", P.Part, args=(1,))
    params = part.rpc_sync().param_rrefs()
    with pytest.raises(ValueError, match="Invalid learning rate"):
        rpc.optim.DistributedOptimizer(torch.optim.SGD, params, lr=-1.0)
    with pytest.raises(TypeError, match="torch.optim.Optimizer subclass"):
        rpc.optim.DistributedOptimizer("sgd", params, lr=0.1)
    opt = rpc.optim.DistributedOptimizer(torch.optim.SGD, params, lr=0.1)
    with pytest.raises(RuntimeError, match="context 999 does not exist on worker1"):
        opt.step(999)
