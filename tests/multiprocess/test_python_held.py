"""What Python holds never makes an I/O thread wait for the GIL (csrc/common/
python_held.h): a tensor whose Python object torch keeps alive for C++, in a
sent message, an RRef's value or a call's result, is let go of elsewhere. A
3-worker job; workers 1 and 2 run with a probe that logs every time one of
their threads that must never wait for the GIL (I/O, deadlines, timers, the
pool's watchdog) asks for it."""

import shutil
import tempfile

import pytest
import torch

import torchrpc as rpc
from tests.csrc import hooks
from tests.multiprocess import funcs, python_held_funcs, rref_funcs
from tests.multiprocess.cluster import Cluster


@pytest.fixture(scope="module", autouse=True)
def job():
    folder = tempfile.mkdtemp(prefix="torchrpc-gil-probe-")
    probe = python_held_funcs.probe_env(folder)
    try:
        with Cluster(3, worker_env={1: probe, 2: probe}) as c:
            yield c
    finally:
        shutil.rmtree(folder, ignore_errors=True)


needs_probe = pytest.mark.skipif(not python_held_funcs.PROBE_WORKS,
                                 reason="the GIL probe needs Python built with a shared libpython")


@needs_probe
def test_the_probe_sees_the_gil_taken_on_an_io_thread():
    # The probe itself: a thread named rpc-io that takes the GIL is logged.
    assert rpc.rpc_sync("worker1", python_held_funcs.take_gil_as_io_thread) >= 1


@needs_probe
def test_io_threads_take_no_gil_whatever_python_does_with_the_values():
    before = {w: len(rpc.rpc_sync(w, python_held_funcs.gil_takes)) for w in ("worker1", "worker2")}
    left = [rpc.rpc_async("worker1", python_held_funcs.traffic, args=("worker2",), timeout=120),
            rpc.rpc_async("worker2", python_held_funcs.traffic, args=("worker1",), timeout=120)]
    assert [f.wait() for f in left] == [0, 0]
    for worker in ("worker1", "worker2"):
        takes = rpc.rpc_sync(worker, python_held_funcs.gil_takes)[before[worker]:]
        assert not takes, f"{worker} took the GIL where it must not {len(takes)} time(s); the first:\n{takes[0]}"


def test_a_thread_without_the_gil_drops_only_what_no_one_else_holds():
    # Another holder of a tensor, its storage or a tuple could give it a
    # Python object and let go of it between a look and the drop: such values
    # go to rpc-drop (common/python_held.h), even while Python has none.
    assert hooks().drops_without_gil_cases() == {
        "alone": True, "tensor_shared": False, "storage_shared": False, "tuple": True, "tuple_shared": False}


@pytest.mark.parametrize("held", ["tensor", "storage"])
def test_a_sent_tensor_that_python_let_go_of_takes_no_gil_on_the_io_thread(held):
    # Once Python drops its tensor, the message's reference is the last.
    # Were the I/O thread to drop it (when the peer has copied it), it would
    # take the GIL, and stall every call (and the heartbeats) while Python
    # holds the GIL; a call sent meanwhile would wait for the connection's
    # lock, which the I/O thread held: a deadlock. The storage's Python object
    # (made by untyped_storage(), share_memory_(), torch.save, a DataLoader)
    # lives as long as the storage, and the message shares that.
    from torchrpc import dispatch

    x = torch.ones(16 << 20)  # 64 MB: lent, let go of once worker1 copied it
    if held == "storage":
        x.untyped_storage()
    invocation = dispatch.invoke("rpc_async", "worker1", torch.add, (x, 1))  # a builtin call keeps no arguments
    del x
    funcs._sleep_holding_gil(2.0)  # meanwhile worker1 copies, adds and answers
    assert invocation.call.done(), "the answer was not taken in while this thread held the GIL"
    assert torch.equal(invocation.wait(), torch.full((16 << 20,), 2.0))


def test_a_value_python_held_is_freed_without_the_gil_on_the_io_thread():
    # rpc.RRef(t) keeps t itself, whose Python object torch keeps alive while
    # C++ holds t: freeing the value takes the GIL. The last user's delete
    # must not make the owner's I/O thread wait for it while Python holds it.
    rref = rpc.rpc_sync("worker1", rref_funcs.rref_of_python_value, args=(torch.ones(4),))
    rpc.rpc_sync("worker1", rref_funcs.rref_settle)  # our fork is the last reference
    rpc.rpc_sync("worker1", funcs.add, args=(torch.ones(1), torch.ones(1)))  # name lookup, once
    with funcs.gil_held_on("worker1", "script calls after the delete"):
        del rref  # its USER_DELETE reaches worker1 before the calls below
        for _ in range(10):
            assert torch.equal(rpc.rpc_sync("worker1", funcs.add, args=(torch.ones(2), torch.ones(2)), timeout=10),
                               torch.full((2,), 2.0))
