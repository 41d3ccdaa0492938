"""Remote objects and the proxies of RRefs (rref.rpc_sync().method(), ...)
against a 3-worker job, and owner RRefs of local values. Every test ends with
no owner RRef left on any worker (the fixtures of test_rref.py)."""

import re

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs, rref_funcs
from tests.multiprocess.test_rref import job, no_leaks, unique  # noqa: F401  (job, no_leaks: fixtures)


# ---- remote objects and proxies -------------------------------------------------

def test_remote_object_and_proxies():
    name = unique("counter")
    obj = rpc.remote("worker1", rref_funcs.Tracked, args=(name, 10))
    assert obj.rpc_sync().get() == 10
    assert obj.rpc_sync().set(11) == 11
    fut = obj.rpc_async().set(12)
    assert isinstance(fut, torch.futures.Future)
    assert fut.wait() == 12
    result = obj.remote().get()
    assert isinstance(result, rpc.RRef) and result.owner_name() == "worker1"
    assert result.to_here() == 12
    assert rpc.rpc_sync("worker1", rref_funcs.tracked_alive, args=(name,))
    copy = obj.to_here()  # a copy of the object, not the object
    assert isinstance(copy, rref_funcs.Tracked) and copy.payload == 12


PLAIN_VALUES = [1, -(1 << 62), 2.5, True, "text", None, (1, "a", None), [1, 2], ["a", "b"],
                {"w": torch.ones(2)}, torch.arange(6).view(2, 3).t(), (torch.ones(1), [2.0, 3.0])]
# Values only a pickle keeps (type, range, or mix): proxies pickle these.
OTHER_VALUES = [1 << 70, [1, "a"], [], {}, {1: "int key"}, torch.nn.Parameter(torch.ones(2)),
                torch.Size([2, 3]), funcs.Counter(4)]


def same(a, b):
    if isinstance(a, torch.Tensor):
        return type(a) is type(b) and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, funcs.Counter):
        return type(b) is funcs.Counter and a.value == b.value
    return type(a) is type(b) and a == b


def test_proxy_calls_keep_every_value_and_type():
    obj = rpc.remote("worker1", funcs.Echo)
    for v in PLAIN_VALUES + OTHER_VALUES:
        assert same(obj.rpc_sync().value(v), v), v
        assert same(obj.rpc_async().value(v).wait(), v), v
    args, kwargs = obj.rpc_sync().call(1, torch.ones(2), key="word", other=[1.5])
    assert same(args, (1, torch.ones(2))) and same(kwargs, {"key": "word", "other": [1.5]})
    assert obj.rpc_sync().size_of(torch.ones(2, 3)) == torch.Size([2, 3])
    assert type(obj.rpc_sync().size_of(torch.ones(2, 3))) is torch.Size


def test_proxy_calls_with_plain_arguments_skip_pickling():
    # Plain arguments travel as IValues (RREF_METHOD_CALL); the rest, and the
    # owner's own proxies, as a pickled call.
    obj = rpc.remote("worker1", funcs.Echo)
    for v in PLAIN_VALUES:
        invocation = rpc.rref._method_call("rpc_sync", obj, "value", (v,), {}, -1)
        assert invocation is not None and same(invocation.wait(), v), v
    for v in OTHER_VALUES:
        assert rpc.rref._method_call("rpc_sync", obj, "value", (v,), {}, -1) is None, v
    assert rpc.rref._method_call("rpc_sync", obj, "value", (1,), {"rref": obj}, -1) is None
    assert rpc.rref._method_call("rpc_sync", rpc.RRef(funcs.Echo()), "value", (1,), {}, -1) is None


def test_proxy_calls_keep_requires_grad_outside_a_context():
    obj = rpc.remote("worker2", funcs.Echo)
    x = torch.ones(2, requires_grad=True)
    assert obj.rpc_sync().seen(x) == (("tuple", [("Tensor", True)]), ("dict", {}))
    assert obj.rpc_sync().seen(torch.ones(2)) == (("tuple", [("Tensor", False)]), ("dict", {}))
    y = obj.rpc_sync().grad_result()
    assert y.requires_grad and torch.equal(y.detach(), torch.full((2,), 2.0))
    with rpc.autograd.context():  # recorded: the owner's copy has a history
        assert obj.rpc_sync().seen(x) == (("tuple", [("Tensor", True)]), ("dict", {}))
        with torch.no_grad():  # not recorded: pickled, as outside a context
            assert obj.rpc_sync().seen(x) == (("tuple", [("Tensor", True)]), ("dict", {}))


def test_proxy_errors_name_the_method_and_the_owner():
    obj = rpc.remote("worker1", funcs.Echo)
    with pytest.raises(funcs.CustomError, match="(?s)broken.*worker1.*Echo.fail"):
        obj.rpc_sync().fail("broken")
    fut = obj.rpc_async().fail("broken again")
    with pytest.raises(funcs.CustomError, match="broken again") as caught:
        fut.wait()
    caught.value.__traceback__ = None  # see test_creation_error_surfaces_on_to_here
    with pytest.raises(rpc.RpcTimeoutError, match=r"(?s)worker1.*'sleep\(\) of RRef"):
        obj.rpc_sync(timeout=0.2).sleep(1.0)
    assert obj.rpc_sync().wait_idle()  # the owner served the late call too


def test_proxy_call_of_a_dropped_rref_still_answers():
    # The RRef goes away right after the call is sent: the owner keeps the
    # value until it has answered.
    futures = [rpc.remote("worker2", funcs.Counter, args=(i,)).rpc_async().bump(1) for i in range(20)]
    assert [f.wait() for f in futures] == [i + 1 for i in range(20)]


def test_owner_rref_of_local_value():
    value = funcs.Counter(3)
    rref = rpc.RRef(value)
    assert rref.is_owner()
    assert rref.local_value() is value
    assert rref.to_here() is value
    assert rref.owner() == rpc.get_worker_info()
    assert rref.confirmed_by_owner()
    assert rref.rpc_sync().bump(2) == 5  # a proxy call to ourselves
    assert value.value == 5


def test_local_value_on_a_user_says_who_owns_it():
    rref = rpc.remote("worker2", funcs.py_add, args=(1, 1))
    with pytest.raises(RuntimeError, match=r"can't call localValue\(\) on user WorkerInfo\(id=0, name=worker0\)\. "
                       r"Call it on owner WorkerInfo\(id=2, name=worker2\).*to_here"):
        rref.local_value()


def test_backward_of_a_local_owner_rref():
    x = torch.ones(3, requires_grad=True)
    rpc.RRef((x * 2).sum()).backward()  # no context: a local backward pass
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    with pytest.raises(RuntimeError, match="needs an RRef of a tensor"):
        rpc.RRef(1).backward()


def test_rref_cannot_be_pickled_outside_rpc():
    import pickle

    with pytest.raises(RuntimeError, match="only be pickled by torchrpc"):
        pickle.dumps(rpc.RRef(1))


# ---- upstream's RRef helpers: _get_type, _get_future, str ------------------------

@pytest.mark.parametrize("blocking", [True, False])
def test_get_type_asks_the_owner_once(blocking):
    def get_type(rref):
        t = rref._get_type(blocking=blocking)
        return t if blocking else t.wait()

    obj = rpc.remote("worker1", rref_funcs.Tracked, args=(unique("typed"), 1))
    assert get_type(obj) is rref_funcs.Tracked
    first = obj._get_type(blocking=False)  # remembered: the same future, and no call
    assert obj._get_type(blocking=False) is first and first.wait() is rref_funcs.Tracked
    assert get_type(rpc.RRef(torch.ones(2))) is torch.Tensor  # the owner's own
    failing = rpc.remote("worker2", funcs.raise_custom, args=("no value, no type",))
    with pytest.raises(funcs.CustomError, match="no value, no type") as caught:
        get_type(failing)
    caught.value.__traceback__ = None  # it references the future that holds it (see test_rref.py)


def test_remote_proxy_of_a_missing_method_fails_at_once():
    obj = rpc.remote("worker1", rref_funcs.Tracked, args=(unique("missing"), 1))
    with pytest.raises(AttributeError, match="'Tracked' object has no attribute 'non_exist'"):
        obj.remote().non_exist()
    with pytest.raises(AttributeError, match="has no attribute 'non_exist'"):
        obj.rpc_sync().non_exist()
    with pytest.raises(AttributeError, match="has no attribute 'non_exist'") as caught:
        obj.rpc_async().non_exist().wait()
    caught.value.__traceback__ = None


def test_get_future_completes_with_the_creation():
    slow = rpc.remote("worker1", funcs.sleep, args=(0.3,))
    fut = slow._get_future()
    assert isinstance(fut, torch.futures.Future) and not fut.done()
    assert fut.wait() is None and slow.confirmed_by_owner()
    failing = rpc.remote("worker2", funcs.raise_custom, args=("never created",))
    failing._get_future().wait()  # the owner answered: its error is ready for to_here
    with pytest.raises(funcs.CustomError, match="never created"):
        failing.to_here()
    assert rpc.RRef(1)._get_future().wait() is None  # the owner's own: done at once


def test_str_shows_the_ids_as_upstream():
    owner = rpc.RRef(7)
    assert str(owner).startswith("OwnerRRef(GloballyUniqueId(created_on=0, local_id=")
    user = rpc.remote("worker1", funcs.pid)
    assert re.fullmatch(r"UserRRef\(RRefId = GloballyUniqueId\(created_on=0, local_id=(\d+)\), "
                        r"ForkId = GloballyUniqueId\(created_on=0, local_id=(\d+)\)\)", str(user))
    rref_id, fork_id = map(int, re.findall(r"local_id=(\d+)", str(user)))
    assert fork_id == rref_id + 1
    user.to_here()
