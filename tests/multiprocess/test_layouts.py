"""Tensor layouts across a 2-worker job (csrc/message/tensor_layout.h):
sparse tensors (COO, CSR, CSC, BSR) travel as their components, never
densified, as arguments and results of Python, builtin and TorchScript calls
and as RRef values; a non-contiguous view arrives with its strides, and a
slice of a large tensor sends only its elements; sparse gradients flow
through distributed autograd, and a parameter server with
nn.Embedding(sparse=True) trains through DistributedOptimizer exactly as the
same model trains in one process."""

import pytest
import torch
from torch.testing import assert_close

import torchrpc as rpc
from tests.csrc import hooks
from tests.multiprocess import funcs
from tests.multiprocess import layout_funcs as L
from tests.multiprocess.cluster import Cluster


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(2) as c:
        yield c


def dense():
    x = torch.zeros(6, 6)
    x[0, 1], x[2, 2], x[3, 0], x[5, 4] = 1.0, 2.0, 3.0, 4.0
    return x


SPARSE = {
    "coo": lambda: torch.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3.0, 4.0, 5.0], (2, 3), check_invariants=True),
    "coo_coalesced": lambda: dense().to_sparse(),
    "coo_hybrid": lambda: torch.arange(24.0).reshape(4, 3, 2).to_sparse(sparse_dim=1),
    "csr": lambda: dense().to_sparse_csr(),
    "csc": lambda: dense().to_sparse_csc(),
    "bsr": lambda: dense().to_sparse_bsr((2, 2)),
}


def assert_same_sparse(got, want):
    assert got.layout == want.layout and got.dtype == want.dtype and got.shape == want.shape
    if want.layout == torch.sparse_coo:
        assert got.is_coalesced() == want.is_coalesced()
    for g, w in zip(L.components(got), L.components(want)):
        assert torch.equal(g, w)


# ---- sparse values -------------------------------------------------------------


@pytest.mark.parametrize("make", SPARSE.values(), ids=SPARSE.keys())
def test_sparse_arguments_and_results_of_a_python_call(make):
    t = make()
    seen, mine = rpc.rpc_sync("worker1", L.describe, args=(t,)), L.describe(t)
    assert seen.pop("bytes") == sum(p.nbytes for p in L.components(t))  # the components' memory, no more
    mine.pop("bytes")
    assert seen == mine
    assert_same_sparse(rpc.rpc_sync("worker1", L.echo, args=(t,)), t)
    out = rpc.rpc_sync("worker1", L.echo, args=({"nested": [t, (t, 3)]},))
    assert_same_sparse(out["nested"][1][0], t)


@pytest.mark.parametrize("make", [SPARSE["coo"], SPARSE["coo_coalesced"], SPARSE["csr"]], ids=["coo", "coo_coalesced", "csr"])
def test_builtin_and_script_calls_on_sparse_tensors(make):
    t = make()
    for fn, args in ((torch.mul, (t, 2.0)), (L.script_scaled, (t, 2.0))):
        out = rpc.rpc_sync("worker1", fn, args=args)
        assert out.layout == t.layout and torch.equal(out.to_dense(), 2 * t.to_dense())
    out = rpc.rpc_async("worker1", torch.add, args=(t, t)).wait()
    assert out.layout == t.layout and torch.equal(out.to_dense(), 2 * t.to_dense())


def test_sparse_rref_values():
    t = SPARSE["coo"]()
    for fn, args in ((L.scaled, (t, 3.0)), (torch.mul, (t, 3.0)), (L.script_scaled, (t, 3.0))):
        rref = rpc.remote("worker1", fn, args=args)
        got = rref.to_here()
        assert got.is_sparse and torch.equal(got.to_dense(), 3 * t.to_dense())
        # the owner's value, passed by reference back to it and to a third party (us)
        assert rpc.rpc_sync("worker1", L.describe_rref, args=(rref,))["layout"] == "torch.sparse_coo"
    mine = rpc.RRef(SPARSE["csr"]())
    assert rpc.rpc_sync("worker1", L.describe_rref, args=(mine,))["layout"] == "torch.sparse_csr"


def test_a_sparse_tensor_is_never_densified():
    # 10^5 x 10^5 floats would be 40 GB dense; three entries travel as 3 x 3 numbers
    t = torch.sparse_coo_tensor([[0, 7, 99_999], [5, 7, 99_999]], [1.0, 2.0, 3.0], (100_000, 100_000),
                                check_invariants=True)
    seen = rpc.rpc_sync("worker1", L.describe, args=(t,))
    assert seen["components"] == [("torch.int64", (2, 3)), ("torch.float32", (3,))]
    assert seen["bytes"] == 2 * 3 * 8 + 3 * 4
    assert_same_sparse(rpc.rpc_sync("worker1", torch.add, args=(t, t)), t + t)


def test_large_sparse_components_travel_by_the_same_host_copy():
    pid, _ = rpc.rpc_sync("worker1", funcs.verify_same_host_offer, args=(hooks().same_host_offer(),))
    n = 1 << 17  # values of 512 KB, indices of 1 MB: both lent
    t = torch.sparse_coo_tensor(torch.arange(n).unsqueeze(0), torch.randn(n), (n,), check_invariants=True)
    before = rpc.rpc_sync("worker1", funcs.same_host_copied_bytes)
    assert_same_sparse(rpc.rpc_sync("worker1", L.echo, args=(t,)), t)
    if pid != -1:  # the machine lets processes read each other's memory
        assert rpc.rpc_sync("worker1", funcs.same_host_copied_bytes) - before == n * 8 + n * 4


# ---- strided layouts ----------------------------------------------------------------


def test_a_view_arrives_with_its_strides():
    x = torch.arange(12.0).reshape(3, 4)
    narrow = torch.rand(5, 5).narrow(1, 2, 2)  # upstream's test_non_cont_tensors
    image = torch.rand(2, 3, 4, 5).to(memory_format=torch.channels_last)
    for view in (x.t(), narrow, image):
        seen = rpc.rpc_sync("worker1", L.describe, args=(view,))
        assert seen["stride"] == view.stride() and not seen["contiguous"]
        back = rpc.rpc_sync("worker1", L.echo, args=(view,))
        assert back.stride() == view.stride() and torch.equal(back, view)
    assert rpc.rpc_sync("worker1", L.script_strides, args=(x.t(),)) == list(x.t().stride())
    assert rpc.rpc_sync("worker1", torch.clone, args=(x.t(),)).stride() == x.t().stride()  # clone keeps it


def test_a_slice_of_a_large_tensor_sends_only_its_elements():
    big = torch.rand(1000, 1000)
    column = big[:, 7]
    seen = rpc.rpc_sync("worker1", L.describe, args=(column,))
    assert seen["contiguous"] and seen["bytes"] == 1000 * 4  # not the 4 MB it spans
    assert torch.equal(rpc.rpc_sync("worker1", L.echo, args=(column,)), column)


# ---- tensors that share memory --------------------------------------------------------------


def test_tensors_that_share_memory_arrive_sharing_it():
    # As upstream: a callee that changes one in place changes the other.
    x = torch.arange(6.0)
    changed = torch.tensor([0.0, 1, 102, 103, 4, 5])
    assert torch.equal(rpc.rpc_sync("worker1", L.bump_second, args=(x, x[2:4])), changed)
    assert torch.equal(rpc.rpc_sync("worker1", L.script_bump_second, args=(x, x[2:4])), changed)
    assert torch.equal(x, torch.arange(6.0))  # the caller's own tensors are never changed
    for a, b in (rpc.rpc_sync("worker1", L.with_view, args=(5,)),
                 rpc.remote("worker1", L.with_view, args=(5,)).to_here()):
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and b.storage_offset() == 1
        assert torch.equal(b, torch.tensor([1.0, 2.0]))


# ---- tensors on no CPU ----------------------------------------------------------------------
# torchrpc sends CPU tensors only. A tensor elsewhere (CUDA; here torch's meta
# device, which every build has) is refused with an error that says to call
# .cpu(): as an argument before anything is sent, as a result by the callee,
# which stays up. Its bytes are never read (a CUDA pointer read on the host
# would crash the worker).


# A call to this worker itself copies its tensors as a call to a peer does.
DESTINATIONS = ["worker1", "worker0"]


@pytest.mark.parametrize("to", DESTINATIONS)
@pytest.mark.parametrize("kind", ["python", "builtin", "script"])
def test_an_argument_on_another_device_is_refused_before_sending(kind, to):
    m = torch.empty(3, device="meta")
    fn, args = {"python": (L.echo, (m,)), "builtin": (torch.add, (m, 1)), "script": (L.script_scaled, (m, 2.0))}[kind]
    with pytest.raises(ValueError, match=rf"worker0 -> {to} .*CPU tensors only; tensor #0 is on meta\. Move it with \.cpu\(\)"):
        rpc.rpc_sync(to, fn, args=args)
    with pytest.raises(ValueError, match="CPU tensors only"):
        rpc.remote(to, fn, args=args)


@pytest.mark.parametrize("to", DESTINATIONS)
def test_a_result_on_another_device_fails_the_call_and_the_callee_stays_up(to):
    # It names the call (the callee no longer knows the function when the result fails to encode).
    with pytest.raises(ValueError, match=rf"worker0 -> {to} .*'tests\.multiprocess\.layout_funcs\.on_meta': its "
                                         r"result cannot be sent back: torchrpc sends CPU tensors only; tensor #0 is "
                                         rf"on meta\. Move it with \.cpu\(\) before it is sent\. \(raised on {to}\)"):
        rpc.rpc_sync(to, L.on_meta, args=((2,),))
    rref = rpc.remote(to, L.on_meta, args=((2,),))
    if to == "worker0":  # an owner keeps its value: nothing travels, as upstream's
        assert rref.to_here().device.type == "meta"
    else:
        with pytest.raises(ValueError, match="CPU tensors only; tensor #0 is on meta"):
            rref.to_here()
    assert torch.equal(rpc.rpc_sync(to, torch.add, args=(torch.ones(2), 1)), torch.full((2,), 2.0))


# ---- sparse gradients ---------------------------------------------------------------------


def test_sparse_gradients_in_distributed_autograd():
    # The table is here, the computation on worker1: the gradient that comes
    # back is sparse, as local autograd makes it.
    weight = torch.randn(10, 3).requires_grad_()
    ids = torch.tensor([1, 4, 4, 7])
    with rpc.autograd.context() as ctx:
        rows = torch.nn.functional.embedding(ids, weight, sparse=True)
        loss = rpc.rpc_sync("worker1", torch.mul, args=(rows, rows)).sum()
        rpc.autograd.backward(ctx, [loss])
        got = rpc.autograd.get_gradients(ctx)[weight]
    rows = torch.nn.functional.embedding(ids, weight, sparse=True)
    (rows * rows).sum().backward()
    assert got.is_sparse and weight.grad.is_sparse
    assert_close(got.to_dense(), weight.grad.to_dense())


def _trainer_step(ps, linear, ids, target):
    rows = ps.rpc_sync().forward(ids) if isinstance(ps, rpc.RRef) else ps.forward(ids)
    return ((linear(rows).squeeze(-1) - target) ** 2).mean()


def _batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, 50, (8,), generator=g), torch.randn(8, generator=g)


@pytest.mark.parametrize("optimizer_class, kwargs", [
    (torch.optim.SGD, dict(lr=0.5)),
    (torch.optim.Adagrad, dict(lr=0.3)),
], ids=["sgd", "adagrad"])
def test_sparse_embedding_parameter_server_trains_as_locally(optimizer_class, kwargs):
    ps = rpc.remote("worker1", L.EmbeddingServer, args=(7, 50, 4))
    linear = torch.nn.Linear(4, 1)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[0.5, -0.25, 1.0, 0.75]]))
        linear.bias.fill_(0.1)
    params = ps.rpc_sync().param_rrefs() + [rpc.RRef(p) for p in linear.parameters()]
    opt = rpc.optim.DistributedOptimizer(optimizer_class, params, **kwargs)

    ref_ps, ref_linear = L.EmbeddingServer(7, 50, 4), torch.nn.Linear(4, 1)
    ref_linear.load_state_dict(linear.state_dict())
    ref_opt = optimizer_class(list(ref_ps.emb.parameters()) + list(ref_linear.parameters()), **kwargs)

    for step in range(5):
        ids, target = _batch(step)
        with rpc.autograd.context() as ctx:
            rpc.autograd.backward(ctx, [_trainer_step(ps, linear, ids, target)])
            grad = ps.rpc_sync().gradient(ctx)
            assert grad.is_sparse  # the table's gradient stayed sparse on its owner
            opt.step(ctx)
        ref_opt.zero_grad()
        _trainer_step(ref_ps, ref_linear, ids, target).backward()
        assert ref_ps.emb.weight.grad.is_sparse
        # torch's Adagrad builds sparse tensors without choosing whether to check them
        with torch.sparse.check_sparse_tensor_invariants():
            ref_opt.step()
    assert_close(ps.rpc_sync().weight(), ref_ps.weight())
    assert_close(linear.weight, ref_linear.weight)
    assert_close(linear.bias, ref_linear.bias)
