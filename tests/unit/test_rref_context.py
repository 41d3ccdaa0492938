"""The RRef protocol of csrc/rref/rref_context, driven directly: three agents
and their RRef contexts in this one process (no init_rpc), so every step
(fork, confirmation, CHILD_ACCEPT, USER_DELETE) and out-of-order messages can
be checked on each side."""

import gc

import pytest
import torch

from tests.csrc import hooks
from torchrpc import python_fallback
from torchrpc._extension import native


def agent_options(C, name, rank, world_size, timeout):
    o = C.AgentOptions()
    o.name, o.rank, o.world_size = name, rank, world_size
    o.num_worker_threads, o.rpc_timeout = 2, timeout
    o.listen_host, o.host_id = "127.0.0.1", "test-host"
    return o


class World:
    def __init__(self, n, timeout=10.0):
        C = native()
        self.agents = [C.Agent(agent_options(C, f"w{r}", r, n, timeout)) for r in range(n)]
        addresses = [a.listen() for a in self.agents]
        peers = [(f"w{r}", r, tcp, unix, "test-host") for r, (tcp, unix) in enumerate(addresses)]
        for a in self.agents:
            a.set_peers(peers)
        for a in self.agents:
            a.set_python_handler(python_fallback.handle_call, python_fallback.handle_remote,
                                 python_fallback.encode_value)
        self.ctx = [C.RRefContext(a, python_fallback.encode_value, python_fallback.handle_method)
                    for a in self.agents]
        for a in self.agents:
            a.start_serving()

    def settle(self):
        gc.collect()
        for _ in range(2):
            for c in self.ctx:
                assert c.wait_idle(10.0) == 0

    def owners(self, rank):
        return {o[0]: sorted(o[1]) for o in self.ctx[rank].snapshot()["owners"]}

    def close(self):
        for c, a in zip(self.ctx, self.agents):
            a.shutdown()
            c.stop()


@pytest.fixture
def world():
    w = World(3)
    yield w
    w.close()


def fetch(ctx, handle):
    ok, value = ctx.fetch(handle, 10.0).result()
    assert ok, value
    return python_fallback.decode_value(value)


def test_owner_forks_to_a_user_confirmed_at_once(world):
    owner = world.ctx[0].create_owner({"v": 1})
    fork = world.ctx[0].fork(owner)
    assert world.owners(0) == {owner.id(): [f"{fork[3]}:{fork[4]}"]}
    user = world.ctx[1].receive(fork)
    assert not user.is_owner() and user.owner() == 0 and user.confirmed()
    assert fetch(world.ctx[1], user) == {"v": 1}
    del user
    world.settle()
    assert world.owners(0) == {}
    assert owner.local_value(1.0) == (True, {"v": 1})  # the owner's own handle keeps it


def test_user_forks_to_user_and_drops_its_copy_before_confirmation(world):
    owner = world.ctx[0].create_owner("value")
    u1 = world.ctx[1].receive(world.ctx[0].fork(owner))
    fork = world.ctx[1].fork(u1)  # u1 -> worker2
    assert world.ctx[1].snapshot()["pending_children"] == [f"{fork[3]}:{fork[4]}"]
    u1_fork = u1.fork_id()
    del u1  # the parent drops its copy at once: the pending child keeps it alive
    gc.collect()
    assert [u[1] for u in world.ctx[1].snapshot()["users"]] == [u1_fork]
    u2 = world.ctx[2].receive(fork)  # FORK_REQUEST to worker0, then CHILD_ACCEPT to worker1
    world.settle()
    assert u2.confirmed()
    assert world.ctx[1].snapshot()["pending_children"] == []
    assert world.ctx[1].snapshot()["users"] == []  # u1 released after the accept...
    assert world.owners(0) == {owner.id(): [u2.fork_id()]}  # ...and only u2 remains
    assert fetch(world.ctx[2], u2) == "value"
    del u2
    world.settle()
    assert world.owners(0) == {}


def test_user_sends_the_rref_back_to_its_owner(world):
    owner = world.ctx[0].create_owner(5)
    u1 = world.ctx[1].receive(world.ctx[0].fork(owner))
    back = world.ctx[0].receive(world.ctx[1].fork(u1))
    assert back.is_owner() and back.id() == owner.id()
    world.settle()  # CHILD_ACCEPT reached worker1
    assert world.ctx[1].snapshot()["pending_children"] == []
    assert world.owners(0) == {owner.id(): [u1.fork_id()]}  # the phantom fork is never added


def test_a_user_rref_in_a_request_to_its_owner_is_released_by_the_answer(world):
    owner = world.ctx[0].create_owner(5)
    u1 = world.ctx[1].receive(world.ctx[0].fork(owner))
    fork = world.ctx[1].fork(u1, request_to=0)
    assert fork[6] == 1  # answered: no CHILD_ACCEPT will come
    back = world.ctx[0].receive(fork)
    assert back.is_owner() and back.id() == owner.id()
    world.settle()
    held = f"{fork[3]}:{fork[4]}"
    assert world.ctx[1].snapshot()["pending_children"] == [held]
    request = world.ctx[1].fetch(u1, 10.0)  # stands for the request that carried the fork
    world.ctx[1].release_when_answered(request, [fork])
    assert request.result()[0]
    world.settle()
    assert world.ctx[1].snapshot()["pending_children"] == []
    # A fork to another worker, or in a response, still waits for CHILD_ACCEPT.
    assert world.ctx[1].fork(u1, request_to=2)[6] == 0 and world.ctx[1].fork(u1)[6] == 0


def test_a_request_that_timed_out_keeps_its_hold(world):
    # The owner may still decode a timed-out request: the hold stays (until
    # shutdown releases every user RRef).
    owner = world.ctx[0].create_owner(5)
    u1 = world.ctx[1].receive(world.ctx[0].fork(owner))
    fork = world.ctx[1].fork(u1, request_to=0)
    never = world.ctx[1].receive((0, 0, 999, 0, 5, 0, 0))  # a value the owner never creates
    request = world.ctx[1].fetch(never, 0.2)
    world.ctx[1].release_when_answered(request, [fork])
    ok, error = request.result()
    assert not ok and "timed out" in error[1]
    assert world.ctx[1].snapshot()["pending_children"] == [f"{fork[3]}:{fork[4]}"]


def test_owner_sends_to_itself(world):
    owner = world.ctx[0].create_owner(1)
    again = world.ctx[0].receive(world.ctx[0].fork(owner))
    assert again.is_owner() and again.id() == owner.id()
    assert world.owners(0) == {}


def test_out_of_order_messages(world):
    c = world.ctx[0]
    # A FORK_REQUEST that arrives before the REMOTE_CALL creating the RRef.
    hooks().on_fork_request(c, 1, 777, 2, 5)
    snap = c.snapshot()
    assert snap["owners"] == [("1:777", ["2:5"], False, False)]
    hooks().on_user_delete(c, 1, 777, 2, 5)
    assert world.owners(0) == {}
    # Deletes and accepts nobody expects are ignored.
    hooks().on_user_delete(c, 1, 778, 2, 6)
    hooks().on_child_accept(c, 2, 99)
    assert world.owners(0) == {} and c.snapshot()["pending_children"] == []


def test_a_lost_peer_releases_its_forks_and_awaited_entries(world):
    c = world.ctx[0]
    owner = c.create_owner("held")
    c.fork(owner, request_to=1)  # sent to worker1 in a request: worker1 holds it
    kept = c.fork(owner, request_to=2)
    hooks().on_fork_request(c, 1, 777, 1, 5, holder=1)  # worker1 holds a fork of an RRef not created yet
    assert hooks().awaited_count(c, 1) == 1
    hooks().release_peer(c, 1)
    assert world.owners(0) == {owner.id(): [f"{kept[3]}:{kept[4]}"]}
    assert hooks().awaited_count(c, 1) == 0


def test_awaited_entries_are_capped_per_peer(world):
    c, cap = world.ctx[0], 4096  # csrc/rref/owner_table.h kMaxAwaitedPerPeer
    for i in range(cap):
        hooks().on_fork_request(c, 2, 1000 + i, 1, i, holder=1)
    with pytest.raises(RuntimeError, match=f"RRef 2:99999 does not exist .*the cap is {cap} per peer"):
        hooks().on_fork_request(c, 2, 99999, 1, 99999, holder=1)
    hooks().on_fork_request(c, 2, 99999, 2, 1, holder=2)  # another peer has a cap of its own
    hooks().release_peer(c, 1)
    assert list(world.owners(0)) == ["2:99999"]


def test_an_awaited_rref_expires_and_answers_its_waiters():
    world = World(2, timeout=0.3)
    try:
        # worker1 holds a fork of an RRef of worker0 whose creation never comes
        never = world.ctx[1].receive((0, 0, 999, 0, 5, 0, 0))
        ok, error = world.ctx[1].fetch(never, 10.0).result()
        assert not ok and "did not reach w0 within" in error[1], error
        assert world.owners(0) == {}
    finally:
        world.close()


def test_cancelled_forks_are_undone(world):
    owner = world.ctx[0].create_owner(1)
    world.ctx[0].cancel_fork(world.ctx[0].fork(owner))
    assert world.owners(0) == {}
    u1 = world.ctx[1].receive(world.ctx[0].fork(owner))
    world.ctx[1].cancel_fork(world.ctx[1].fork(u1))
    assert world.ctx[1].snapshot()["pending_children"] == []


def remote_builtin(ctx, dst, op, args, timeout):
    message, schema_name = native().builtin_message(op, args, {})
    return ctx.remote(dst, message, timeout, schema_name)


def test_remote_builtin_and_fetch(world):
    user = remote_builtin(world.ctx[0], 1, "aten::add", (torch.ones(2), torch.ones(2)), 10.0)
    assert not user.is_owner() and user.owner() == 1
    assert torch.equal(fetch(world.ctx[0], user), torch.full((2,), 2.0))
    world.settle()
    assert user.confirmed()
    assert world.owners(1) == {user.id(): [user.fork_id()]}
    del user
    world.settle()
    assert world.owners(1) == {}
    assert world.ctx[1].snapshot()["owner_objects"] == []


def test_remote_to_an_unreachable_worker_reports_on_to_here(world):
    world.agents[2].shutdown()
    user = remote_builtin(world.ctx[0], 2, "aten::neg", (torch.ones(1),), 5.0)
    world.settle()
    kind, message, _, _ = user.creation_error()
    assert kind == 2 and "w2" in message  # PeerUnreachable, naming the owner


def test_release_all_users_at_shutdown(world):
    owner = world.ctx[0].create_owner(1)
    user = world.ctx[1].receive(world.ctx[0].fork(owner))
    world.ctx[1].release_all_users()
    world.settle()
    assert world.owners(0) == {}
    del user  # already released: sends nothing more
    gc.collect()
    assert world.ctx[1].snapshot()["in_flight"] == 0


def test_rref_of_another_session_cannot_be_sent(world):
    owner = world.ctx[0].create_owner(1)
    with pytest.raises(RuntimeError, match="earlier torchrpc session"):
        world.ctx[1].fork(owner)


def test_method_call_runs_on_the_owners_value(world):
    # RREF_METHOD_CALL (proxies with plain arguments): no fork travels, the
    # owner calls the method on the value it holds, TorchScript or Python.
    tensor = world.ctx[1].receive(world.ctx[0].fork(world.ctx[0].create_owner(torch.ones(3))))
    mapping = world.ctx[2].receive(world.ctx[0].fork(world.ctx[0].create_owner({"v": [1, 2]})))
    ok, value = world.ctx[1].method_call(tensor, "add", (torch.ones(3),), {"alpha": 2}, 10.0, "rpc_sync").result()
    assert ok and torch.equal(python_fallback.decode_value(value), torch.full((3,), 3.0))
    ok, value = world.ctx[2].method_call(mapping, "get", ("v",), {}, 10.0, "rpc_sync").result()
    assert ok and python_fallback.decode_value(value) == [1, 2]
    ok, (kind, message, remote_type, _) = world.ctx[2].method_call(mapping, "nope", (), {}, 10.0,
                                                                     "rpc_sync").result()
    assert not ok and remote_type == "AttributeError" and "nope" in message and "w0" in message
    assert world.ctx[1].method_call(tensor, "add", (object(),), {}, 10.0, "rpc_sync") is None  # not an IValue
    del tensor, mapping
    world.settle()
    assert world.owners(0) == {}
