"""remote() and RRef against a 3-worker job: the three kinds of creator,
RRefs as arguments and results (nested, back to the owner), distributed
reference counting, creation errors, and tensors that require grad (remote
objects and proxies: test_rref_proxies.py). Every test ends with no owner
RRef left on any worker."""

import gc
import uuid

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs, rref_funcs
from tests.multiprocess.cluster import Cluster

WORKERS = ["worker0", "worker1", "worker2"]


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3) as c:
        yield c


def settle():
    """Drops garbage RRefs everywhere and waits until every delete was answered
    (users first: a user's delete can make another worker's value garbage)."""
    for _ in range(2):
        gc.collect()
        assert rpc.rref._wait_idle(10.0) == 0
        for name in WORKERS[1:]:
            assert rpc.rpc_sync(name, rref_funcs.rref_settle) == 0


def owners_everywhere():
    out = {"worker0": rpc.rref._live_rrefs()["owner_objects"]}
    for name in WORKERS[1:]:
        out[name] = rpc.rpc_sync(name, rref_funcs.live_rrefs)["owner_objects"]
    return out


@pytest.fixture(autouse=True)
def no_leaks():
    """Every test ends with no owner RRef it made left anywhere (earlier ones,
    kept alive by a failed test's traceback, do not count again)."""
    before = owners_everywhere()
    yield
    for name in WORKERS[1:]:
        rpc.rpc_sync(name, rref_funcs.drop_stored)
    settle()
    after = owners_everywhere()
    assert {name: sorted(set(after[name]) - set(before[name])) for name in WORKERS} == {
        name: [] for name in WORKERS}
    assert rpc.api._debug_info()["pending_requests"] == 0


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---- remote() of the three kinds of callee ----------------------------------

def test_remote_script_function():
    a, b = torch.arange(3.0), torch.ones(3)
    rref = rpc.remote("worker1", funcs.add, args=(a, b))
    assert isinstance(rref, rpc.RRef)
    assert torch.equal(rref.to_here(), a + b)
    assert not rref.is_owner()
    assert rref.owner() == rpc.get_worker_info("worker1")
    assert rref.owner_name() == "worker1"
    assert rpc.rref._wait_idle(10.0) == 0  # remote()'s answer was handled
    assert rref.confirmed_by_owner()


def test_remote_builtin():
    rref = rpc.remote("worker2", torch.add, args=(torch.ones(2), 1), kwargs={"alpha": 2})
    assert torch.equal(rref.to_here(), torch.full((2,), 3.0))


def test_remote_python_values():
    assert rpc.remote("worker1", funcs.py_add, args=(2, 3)).to_here() == 5
    assert rpc.remote("worker1", lambda: {"k": [1, 2]}).to_here() == {"k": [1, 2]}
    assert rpc.remote("worker1", funcs.echo, args=(None,)).to_here() is None


def test_remote_script_value_with_no_tensors():
    assert rpc.remote("worker2", funcs.no_tensors, args=(21,)).to_here() == 42


def test_remote_to_self_is_owner():
    rref = rpc.remote("worker0", funcs.add, args=(torch.ones(1), torch.ones(1)))
    assert rref.is_owner()
    assert torch.equal(rref.to_here(), torch.full((1,), 2.0))
    obj = rpc.remote(0, rref_funcs.Tracked, args=("self", 7))
    assert obj.local_value().payload == 7


def test_many_remotes_in_flight():
    rrefs = [rpc.remote("worker1" if i % 2 else "worker2", funcs.no_tensors, args=(i,)) for i in range(64)]
    assert [r.to_here() for r in rrefs] == [2 * i for i in range(64)]


# ---- RRefs as arguments and results ------------------------------------------------

def test_user_rref_to_another_user():
    rref = rpc.remote("worker1", funcs.add, args=(torch.ones(2), torch.ones(2)))
    assert torch.equal(rpc.rpc_sync("worker2", rref_funcs.rref_to_here, args=(rref,)), torch.full((2,), 2.0))
    # worker2's fork came from a user: as upstream, the call runs once worker1
    # answered worker2's FORK_REQUEST, so inside it the RRef is confirmed.
    assert rpc.rpc_sync("worker2", rref_funcs.rref_info, args=(rref,)) == (False, "worker1", True)
    assert rpc.remote("worker2", rref_funcs.rref_info, args=(rref,)).to_here() == (False, "worker1", True)


def test_user_rref_back_to_its_owner_is_the_owner_rref():
    name = unique("back")
    rref = rpc.remote("worker1", rref_funcs.Tracked, args=(name, 5))
    assert rpc.rpc_sync("worker1", rref_funcs.rref_info, args=(rref,)) == (True, "worker1", True)
    assert rpc.rpc_sync("worker1", rref_funcs.rref_local_value, args=(rref,)).payload == 5


def test_owner_rref_to_users_and_back():
    rref = rpc.RRef(torch.arange(4.0))
    assert torch.equal(rpc.rpc_sync("worker1", rref_funcs.rref_to_here, args=(rref,)), torch.arange(4.0))
    assert rpc.rpc_sync("worker2", rref_funcs.rref_info, args=(rref,)) == (False, "worker0", True)  # from the owner
    # worker1 passes our RRef on to worker2 (user -> user), and back to us (owner).
    assert torch.equal(rpc.rpc_sync("worker1", rref_funcs.rref_forward, args=(rref, "worker2")), torch.arange(4.0))
    assert torch.equal(rpc.rpc_sync("worker1", rref_funcs.rref_forward, args=(rref, "worker0")), torch.arange(4.0))


def test_nested_three_hops():
    # worker0 holds worker1's RRef, gives it to worker2, which gives it to worker0 again.
    rref = rpc.remote("worker1", funcs.py_add, args=([1], [2]))
    assert rpc.rpc_sync("worker2", rref_funcs.rref_forward, args=(rref, "worker0")) == [1, 2]
    assert rpc.rpc_sync("worker2", rref_funcs.rref_forward, args=(rref, "worker2")) == [1, 2]


def test_rref_sent_to_self():
    rref = rpc.remote("worker1", funcs.py_add, args=(1, 2))
    # a user sending to itself, and an owner sending to itself
    assert rpc.rpc_sync("worker2", rref_funcs.rref_to_self, args=(rref,))[:2] == (False, "worker1")
    assert rpc.rpc_sync("worker1", rref_funcs.rref_to_self, args=(rref,)) == (True, "worker1", True)
    owned = rpc.RRef(3)
    assert rref_funcs.rref_to_self(owned) == (True, "worker0", True)


def test_rrefs_inside_containers_and_kwargs():
    a = rpc.remote("worker1", funcs.py_add, args=(1, 2))
    b = rpc.RRef("local")
    out = rpc.rpc_sync("worker2", lambda d, k=None: [r.to_here() for r in d["rrefs"]] + [k.to_here()],
                       args=({"rrefs": [a, b]},), kwargs={"k": a})
    assert out == [3, "local", 3]


def test_rref_next_to_a_lambda_is_forked_once():
    # Pickling falls back to cloudpickle for the lambda: the first attempt's
    # fork of the RRef is undone (the per-test leak check would catch it).
    rref = rpc.remote("worker1", funcs.py_add, args=(1, 2))
    back, fn = rpc.rpc_sync("worker2", funcs.echo, args=(rref, lambda: 7))
    assert fn() == 7 and back.to_here() == 3
    owned = rpc.RRef("mine")
    back, fn = rpc.rpc_sync("worker2", funcs.echo, args=(owned, lambda: 8))
    assert fn() == 8 and back.is_owner()


def test_rref_as_result():
    rref = rpc.rpc_sync("worker1", rref_funcs.make_rref, args=(torch.ones(2),))
    assert rref.owner_name() == "worker1" and not rref.is_owner()
    assert torch.equal(rref.to_here(), torch.ones(2))
    # a user RRef returned by a worker that is not its owner
    rref2 = rpc.rpc_sync("worker2", rref_funcs.remote_from_here, args=("worker1", funcs.py_add, (4, 5)))
    assert rref2.owner_name() == "worker1"
    assert rref2.to_here() == 9
    # an RRef owned by the caller, returned to it
    rref3 = rpc.rpc_sync("worker2", funcs.echo, args=(rpc.RRef("mine"),))
    assert rref3.is_owner() and rref3.local_value() == "mine"


def test_rref_as_remote_argument():
    base = rpc.remote("worker1", funcs.add, args=(torch.ones(2), torch.ones(2)))
    derived = rpc.remote("worker2", rref_funcs.rref_sum, args=(base,))
    assert derived.to_here().item() == 4.0


def test_rref_value_containing_rrefs():
    inner = rpc.remote("worker2", funcs.py_add, args=(10, 1))
    outer = rpc.remote("worker1", funcs.echo, args=([inner, 5],))
    got = outer.to_here()
    assert got[1] == 5 and got[0].owner_name() == "worker2" and got[0].to_here() == 11


# ---- reference counting -----------------------------------------------------------

def test_owner_frees_the_value_when_the_last_user_is_gone():
    name = unique("freed")
    rref = rpc.remote("worker1", rref_funcs.Tracked, args=(name, 1))
    rref.to_here()  # created and confirmed
    assert rpc.rpc_sync("worker2", rref_funcs.store_rref, args=("k", rref)) is False
    del rref
    settle()
    assert rpc.rpc_sync("worker1", rref_funcs.tracked_alive, args=(name,))  # worker2 still holds it
    assert rpc.rpc_sync("worker2", rref_funcs.stored_to_here, args=("k",)).payload == 1
    rpc.rpc_sync("worker2", rref_funcs.drop_stored, args=("k",))
    settle()
    assert not rpc.rpc_sync("worker1", rref_funcs.tracked_alive, args=(name,))


def test_owner_keeps_a_local_value_its_users_dropped():
    value = funcs.Counter(0)
    rref = rpc.RRef(value)
    rpc.rpc_sync("worker1", rref_funcs.rref_info, args=(rref,))
    settle()
    assert rpc.rref._live_rrefs()["owners"] == []  # no user left...
    assert rref.local_value() is value  # ...but our handle keeps it
    assert rref_funcs.rref_to_here(rref) is value


def test_fork_then_drop_before_confirmation():
    # worker0 creates a value on worker1 and, before worker1 even confirmed
    # remote(), forks the RRef to worker2 and drops its own copy. worker2 must
    # still find the value: worker0 keeps its copy until worker2's fork is
    # confirmed (CHILD_ACCEPT), so its USER_DELETE cannot overtake the fork.
    names = [unique("race") for _ in range(20)]
    futures = []
    for i, name in enumerate(names):
        rref = rpc.remote("worker1", rref_funcs.Tracked, args=(name, i))
        futures.append(rpc.rpc_async("worker2", rref_funcs.store_rref, args=(name, rref)))
        del rref
        gc.collect()
    torch.futures.wait_all(futures)
    settle()
    for i, name in enumerate(names):
        assert rpc.rpc_sync("worker2", rref_funcs.stored_to_here, args=(name,)).payload == i
    rpc.rpc_sync("worker2", rref_funcs.drop_stored)
    settle()
    assert not any(rpc.rpc_sync("worker1", rref_funcs.tracked_alive, args=(n,)) for n in names)


def test_confirmed_user_forks_then_drops_at_once():
    # As above, with worker0's own RRef already confirmed: its USER_DELETE
    # would otherwise go out at once and race worker2's FORK_REQUEST.
    names = [unique("race2") for _ in range(20)]
    rrefs = [rpc.remote("worker1", rref_funcs.Tracked, args=(name, i)) for i, name in enumerate(names)]
    assert rpc.rref._wait_idle(10.0) == 0 and all(r.confirmed_by_owner() for r in rrefs)
    futures = []
    for name in names:
        futures.append(rpc.rpc_async("worker2", rref_funcs.store_rref, args=(name, rrefs.pop(0))))
        gc.collect()
    torch.futures.wait_all(futures)
    for i, name in enumerate(names):
        got = rpc.rpc_sync("worker2", rref_funcs.stored_to_here, args=(name,), timeout=10)
        assert got.payload == i


def test_user_sends_its_rref_to_the_owner_and_drops_it_at_once():
    # The owner answers no CHILD_ACCEPT for its own RRef in a call to it:
    # worker0 keeps its copy until the call's answer (the owner decoded the
    # call by then), so its USER_DELETE cannot overtake the call. Proxies
    # (rref.rpc_async().get()) take this path.
    names = [unique("to-owner") for _ in range(20)]
    rrefs = [rpc.remote("worker1", rref_funcs.Tracked, args=(name, i)) for i, name in enumerate(names)]
    assert rpc.rref._wait_idle(10.0) == 0 and all(r.confirmed_by_owner() for r in rrefs)
    futures = []
    for i in range(len(names)):
        rref = rrefs.pop(0)
        futures.append(rref.rpc_async().get() if i % 2 else
                       rpc.rpc_async("worker1", rref_funcs.rref_to_here, args=(rref,)))
        del rref
        gc.collect()
    got = [f.wait() for f in futures]
    assert [g if isinstance(g, int) else g.payload for g in got] == list(range(len(names)))
    settle()
    assert rpc.rref._live_rrefs()["pending_children"] == []
    assert not any(rpc.rpc_sync("worker1", rref_funcs.tracked_alive, args=(n,)) for n in names)


def test_a_call_that_cannot_be_sent_holds_no_rref():
    # The MKL-DNN tensor is refused while sending, after the RRef was forked
    # into the pickle: the forks are undone, nothing waits for an answer.
    rref = rpc.remote("worker1", rref_funcs.Tracked, args=(unique("unsent"), 1))
    rref.to_here()
    unsendable = torch.ones(2, 2).to_mkldnn()
    for send in (lambda to: rpc.rpc_sync(to, rref_funcs.rref_info, args=(rref, unsendable)),
                 lambda to: rpc.remote(to, rref_funcs.rref_info, args=(rref, unsendable))):
        for to in ("worker1", "worker2"):  # the owner (answered fork) and another user
            with pytest.raises(ValueError, match="layout"):
                send(to)
    assert rpc.rref._live_rrefs()["pending_children"] == []


def test_user_forks_to_user_and_drops_at_once():
    # a user -> user fork whose parent drops its copy right after sending
    name = unique("u2u")
    rpc.rpc_sync("worker2", rref_funcs.store_rref, args=("src", rpc.remote("worker1", rref_funcs.Tracked, args=(name, 3))))
    # worker2 sends its RRef to worker0 in a result and forgets it at once
    rref = rpc.rpc_sync("worker2", lambda: rref_funcs._stored.pop("src"))
    settle()
    assert rref.to_here().payload == 3
    del rref
    settle()
    assert not rpc.rpc_sync("worker1", rref_funcs.tracked_alive, args=(name,))


def test_live_rrefs_lists_owners_and_users():
    rref = rpc.remote("worker1", funcs.py_add, args=(1, 1))
    rref.to_here()
    assert rpc.rref._wait_idle(10.0) == 0
    mine = rpc.rref._live_rrefs()
    assert any(u[0] == rref._handle.id() and u[2] == 1 and u[3] for u in mine["users"])
    theirs = rpc.rpc_sync("worker1", rref_funcs.live_rrefs)
    assert any(o[0] == rref._handle.id() and o[1] == [rref._handle.fork_id()] and o[2] for o in theirs["owners"])
    info = rpc.api._debug_info()
    assert info["user_rrefs"] >= 1


# ---- errors ------------------------------------------------------------------------

def test_creation_error_surfaces_on_to_here():
    rref = rpc.remote("worker1", funcs.raise_custom, args=("bad value",))
    with pytest.raises(funcs.CustomError, match="bad value.*worker1") as info:
        rref.to_here()
    assert "raise_custom" in "".join(getattr(info.value, "__notes__", []))
    # ...and on every proxy
    with pytest.raises(funcs.CustomError, match="bad value.*worker1"):
        rref.rpc_sync().anything()
    with pytest.raises(funcs.CustomError, match="bad value") as caught:
        rref.rpc_async().anything().wait()
    # torch.futures.Future.wait() re-raises the exception object the future
    # keeps (in C++), and its traceback then references the future through
    # wait()'s frame: a cycle gc cannot see, which would keep this frame (and
    # `rref`) alive forever. Break it, as callers that catch such errors must.
    caught.value.__traceback__ = None
    with pytest.raises(funcs.CustomError, match="bad value"):
        rref.remote().anything().to_here()


def test_creation_error_of_a_class_and_of_script():
    obj = rpc.remote("worker2", rref_funcs.FailingInit)
    with pytest.raises(funcs.CustomError, match="constructor failed on purpose.*worker2"):
        obj.rpc_sync().get()
    rref = rpc.remote("worker1", funcs.script_raises, args=(torch.ones(1),))
    # (a TorchScript raise comes back as RuntimeError, as from rpc_sync)
    with pytest.raises(RuntimeError, match="(?s)positive input.*worker1"):
        rref.to_here()
    # a user that got the failed RRef from someone else sees the same error
    kind, message = rpc.rpc_sync("worker2", rref_funcs.rref_to_here_error, args=(rref,))
    assert "positive input" in message and "worker1" in message


def test_creation_error_on_self():
    rref = rpc.remote("worker0", funcs.raise_custom, args=("mine",))
    with pytest.raises(funcs.CustomError, match="mine.*worker0"):
        rref.to_here()


def test_rref_where_a_script_function_expects_a_tensor_is_a_type_error():
    # RRefs are TorchScript values now (test_script_rref.py), but not tensors
    rref = rpc.RRef(torch.ones(1))
    with pytest.raises(TypeError, match="(?s)'add'.*Tensor.*RRef"):
        rpc.rpc_sync("worker1", funcs.add, args=(rref, torch.ones(1)))
    with pytest.raises(TypeError, match="(?s)aten::add.*RRef"):
        rpc.remote("worker1", torch.add, args=(rref, 1))


def test_missing_method_on_the_proxy():
    obj = rpc.remote("worker1", funcs.Counter, args=(1,))
    with pytest.raises(AttributeError, match="no_such_method"):
        obj.rpc_sync().no_such_method()


def test_bad_arguments_raise_on_the_caller():
    with pytest.raises(TypeError, match="add"):
        rpc.remote("worker1", funcs.add, args=(1,))
    with pytest.raises(ValueError, match="unknown worker"):
        rpc.remote("nobody", funcs.py_add, args=(1, 2))


# ---- tensors that require grad ----------------------------------------------------

def test_tensors_that_require_grad():
    rref = rpc.remote("worker1", rref_funcs.grad_tensor)
    t = rref.to_here()
    assert torch.equal(t.detach(), torch.full((3,), 2.0))
    x = torch.ones(2, requires_grad=True)
    local = rpc.RRef(x)
    assert rpc.rpc_sync("worker2", rref_funcs.rref_sum, args=(local,)).item() == 2.0
    assert local.to_here() is x and x.requires_grad
    script = rpc.remote("worker2", funcs.add, args=(x, x))
    assert torch.equal(script.to_here().detach(), torch.full((2,), 2.0))


# ---- no GIL on the owner for script and builtin values ------------------------------

def test_remote_script_and_to_here_need_no_gil_on_the_owner():
    rpc.remote("worker2", funcs.add, args=(torch.ones(1), torch.ones(1))).to_here()  # name lookup, once
    with funcs.gil_held_on("worker2", "remote()/to_here"):
        for _ in range(10):
            a = rpc.remote("worker2", funcs.add, args=(torch.ones(2), torch.ones(2)))
            b = rpc.remote("worker2", torch.mul, args=(torch.ones(2), 3))
            assert torch.equal(a.to_here(timeout=10), torch.full((2,), 2.0))
            assert torch.equal(b.to_here(timeout=10), torch.full((2,), 3.0))


def test_values_fetched_before_they_exist_and_freed_when_dropped():
    # The owner's I/O thread takes a fetch of a value still being created (it
    # is answered by the thread that creates it) and a USER_DELETE of a small
    # TorchScript value; Python values, errors and large tensors go to the pool.
    settle()
    before = len(rpc.rpc_sync("worker1", rref_funcs.live_rrefs)["owners"])
    slow = rpc.remote("worker1", funcs.busy, args=(20000,))  # still running when the fetch comes
    python = rpc.remote("worker1", funcs.sleep, args=(0.1,))
    failing = rpc.remote("worker1", funcs.add, args=(torch.ones(2), torch.ones(3)))
    large = rpc.remote("worker1", torch.ones, args=([1 << 19],))  # 2 MB
    assert torch.equal(slow.to_here(), torch.full((16,), 20000.0))
    assert python.to_here() == 0.1
    with pytest.raises(RuntimeError, match="worker1"):
        failing.to_here()
    assert large.to_here().sum().item() == 1 << 19
    assert len(rpc.rpc_sync("worker1", rref_funcs.live_rrefs)["owners"]) == before + 4
    del slow, python, failing, large
    settle()
    assert len(rpc.rpc_sync("worker1", rref_funcs.live_rrefs)["owners"]) == before


def test_a_remote_and_its_fetch_cost_one_pool_task_on_the_owner_and_none_on_the_caller():
    # The owner registers a REMOTE_CALL's RRef on its I/O thread as it reads
    # it, so the fetch sent right behind it finds the entry there and is
    # answered by the thread that creates the value: one pool task per
    # remote() + to_here(), the creation. (When the registration ran on the
    # pool, a fetch read before it made a pool task of its own: up to two.)
    # The script value's USER_DELETE is freed on the I/O thread too. The
    # caller needs no pool task at all: the owner's ack confirms the RRef
    # where it is read, and the USER_DELETE leaves from the thread that drops
    # the RRef (a pool thread's wake-up took the core from the next call).
    # The I/O thread, which must not connect, hands it to the pool when it
    # drops the last reference itself: here the ack has been read first.
    n = 40
    before = rpc.rpc_sync("worker2", funcs.pool_tasks)
    here = funcs.pool_tasks()
    for _ in range(n):
        rref = rpc.remote("worker2", funcs.add, args=(torch.ones(2), torch.ones(2)))
        assert torch.equal(rref.to_here(), torch.full((2,), 2.0))
        rref._get_future().wait()  # confirmed: this thread holds the last reference
        del rref
    here = funcs.pool_tasks() - here
    tasks = rpc.rpc_sync("worker2", funcs.pool_tasks) - before  # this call's task included
    assert tasks <= n + 2, f"{n} remote() + to_here() cost worker2 {tasks} pool tasks"
    assert here <= 2, f"{n} remote() + to_here() cost their caller {here} pool tasks"


# ---- timeouts --------------------------------------------------------------------------

def test_remote_timeout_surfaces_on_to_here():
    rref = rpc.remote("worker1", funcs.sleep, args=(1.0,), timeout=0.2)
    with pytest.raises(rpc.RpcTimeoutError, match="worker1"):
        rref.to_here()
    assert rpc.rref._wait_idle(10.0) == 0
    assert rref.confirmed_by_owner()  # released normally once dropped (leak check below)


def test_to_here_timeout_while_the_value_is_being_created():
    rref = rpc.remote("worker2", funcs.sleep, args=(1.0,), timeout=0)
    with pytest.raises(rpc.RpcTimeoutError, match="worker2"):
        rref.to_here(timeout=0.2)
    assert rref.to_here(timeout=10) == 1.0


def test_call_arguments_are_released_without_the_garbage_collector():
    # RRef lifetimes follow Python references: a call must not keep its
    # arguments in a reference cycle that only gc would free.
    import weakref

    gc.disable()
    try:
        x = torch.ones(4)
        alive = weakref.ref(x)
        assert torch.equal(rpc.rpc_sync("worker1", funcs.py_add, args=(x, x)), 2 * torch.ones(4))
        del x
        assert alive() is None
    finally:
        gc.enable()
