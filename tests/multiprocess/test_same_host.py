"""Same-host copy (csrc/transport/same_host): workers of one host lend each
other tensors of 64 KB and more, and the receiver copies them once, straight
from the sender's memory. worker2 runs with TORCHRPC_SAME_HOST_COPY=0."""

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs
from tests.multiprocess.cluster import Cluster
from tests.csrc import hooks
from torchrpc._extension import native

MB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3, worker_env={2: {"TORCHRPC_SAME_HOST_COPY": "0"}}) as c:
        yield c


@pytest.fixture(scope="module")
def lending():
    """Skips a test that counts copied bytes where the kernel does not let
    processes read each other's memory (seccomp, Yama): tensors then travel
    through the socket, and the tests of their values still run."""
    pid, why = rpc.rpc_sync("worker1", funcs.verify_same_host_offer, args=(hooks().same_host_offer(),))
    if pid == -1:
        pytest.skip(f"this machine refuses cross-process reads ({why}); everything goes through the socket")


def copied(worker=None):
    """Bytes `worker` (default: this one) copied from its peers' memory."""
    if worker is None:
        return native().debug_counters()["same_host_copied_bytes"]
    return rpc.rpc_sync(worker, funcs.same_host_copied_bytes)


def test_large_tensors_are_copied_once_from_the_senders_memory_both_ways(lending):
    x, y = torch.randn(MB // 4), torch.randn(MB // 4)  # 1 MB each
    mine, theirs = copied(), copied("worker1")
    for fn in (funcs.py_add, funcs.add):  # a Python and a TorchScript callee
        assert torch.equal(rpc.rpc_sync("worker1", fn, args=(x, y)), x + y)
    assert copied("worker1") - theirs == 4 * x.nbytes  # two arguments per call, lent
    assert copied() - mine == 2 * x.nbytes  # the results came back the same way


def test_tensors_from_64_kb_are_lent_and_smaller_ones_written(lending):
    # The threshold is same_host::kMinBytes.
    at, below = torch.randn(16 * 1024), torch.randn(16 * 1024 - 1)  # 64 KB, 4 bytes less
    theirs = copied("worker1")
    assert rpc.rpc_sync("worker1", funcs.checksum, args=(at,)) == int(at.sum())
    assert copied("worker1") - theirs == at.nbytes
    assert rpc.rpc_sync("worker1", funcs.checksum, args=(below,)) == int(below.sum())
    assert copied("worker1") - theirs == at.nbytes


def test_lent_and_written_tensors_mix_in_one_message():
    base = torch.arange(4 * MB // 4, dtype=torch.float32).reshape(1024, -1)
    values = [base.t()[:, 1:], torch.ones(3), base[::2], torch.empty(0), torch.arange(70_000, dtype=torch.int64)]
    out = rpc.rpc_sync("worker1", funcs.echo, args=tuple(values))
    assert len(out) == len(values) and all(torch.equal(o, v) for o, v in zip(out, values))


def test_many_lent_tensors_in_flight_arrive_intact():
    xs = [torch.full((MB // 8,), float(i)) for i in range(32)]  # 512 KB each
    futs = [rpc.rpc_async("worker1", funcs.checksum, args=(x,)) for x in xs]
    assert [f.wait() for f in futs] == [int(x.sum()) for x in xs]


def test_lent_memory_is_released_as_the_peer_copies_it():
    # The sender holds lent tensors until the receiver says it copied them,
    # and waits while it holds more than 64 MB: 1.5 GB in a row only goes
    # through if every release arrives.
    x = torch.ones(48 * MB // 4)
    for _ in range(32):
        assert rpc.rpc_sync("worker1", funcs.checksum, args=(x,), timeout=20) == x.numel()


def test_a_worker_without_same_host_copy_gets_every_byte_through_the_socket():
    x = torch.randn(MB // 4)
    mine = copied()
    assert torch.equal(rpc.rpc_sync("worker2", funcs.py_add, args=(x, x)), x + x)
    assert torch.equal(rpc.rpc_sync("worker2", funcs.call, args=("worker1", funcs.py_add, (x, x))), x + x)
    assert copied("worker2") == 0 and copied() == mine  # it neither borrows nor lends


def test_an_offer_is_accepted_only_from_the_process_that_made_it():
    pid, why = hooks().same_host_verify(hooks().same_host_offer())
    assert why == "" and pid > 0
    offer = bytearray(hooks().same_host_offer())
    offer[-1] ^= 0xFF  # another secret: the pid names some other process
    pid, why = hooks().same_host_verify(bytes(offer))
    assert pid == -1 and "another process" in why
    pid, why = hooks().same_host_verify(b"short")
    assert pid == -1 and "malformed offer" in why
