"""Callees that compute, and workers that wait: a callee's pool threads run
ops with torch's intra-op thread setting (or TORCHRPC_INTRA_OP_THREADS), so a
network run inside a call gives torch's result to the last bit; and workers
that have served calls use no CPU while they wait."""

import os
import time

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import compute_funcs as cf
from tests.multiprocess.cluster import Cluster
from tests.multiprocess.probes import cpu_seconds


# worker3's program sets torch's count before init_rpc, to one that is not
# OpenMP's default (the cores), so that a thread that skipped it shows.
SET_BY_PROGRAM = (os.cpu_count() or 1) + 1


@pytest.fixture(scope="module", autouse=True)
def job():
    # worker2 overrides the setting; worker1 keeps torch's.
    with Cluster(4, worker_env={2: {"TORCHRPC_INTRA_OP_THREADS": "1"},
                                3: {"TEST_TORCH_NUM_THREADS": str(SET_BY_PROGRAM)}}) as c:
        yield c


@pytest.fixture
def threads():
    """Restores this process's intra-op thread count after the test."""
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def test_pool_threads_follow_torchs_setting():
    setting = rpc.rpc_sync("worker1", cf.torch_setting)
    assert rpc.rpc_sync("worker1", cf.this_thread_num_threads) == setting
    # and each of them does: calls in flight at once run on different pool threads
    futs = [rpc.rpc_async("worker1", cf.this_thread_num_threads) for _ in range(8)]
    assert [f.wait() for f in futs] == [setting] * 8


def test_onednn_ops_on_pool_threads_follow_the_programs_setting():
    # oneDNN's ops (an LSTM, a convolution) read the thread's OpenMP count
    # directly. Pool threads that took torch's setting only lazily, at their
    # first ATen parallel op, ran them with OpenMP's default (the cores)
    # before that, whatever torch.set_num_threads said (upstream's RPC threads
    # still do): a spinning extra thread, and results off in the last digits.
    futs = [rpc.rpc_async("worker3", cf.openmp_threads_here) for _ in range(8)]
    assert [f.wait() for f in futs] == [SET_BY_PROGRAM] * 8


def test_intra_op_threads_variable_overrides_torchs_setting():
    assert rpc.rpc_sync("worker2", cf.this_thread_num_threads) == 1


@pytest.mark.parametrize("kind", ["python", "script"])
def test_cnn_in_a_call_matches_torch_bit_for_bit(kind, threads):
    x, w = cf.cnn_input(), cf.cnn_weights()
    args = (x, w["w1"], w["b1"], w["w2"], w["b2"], w["wf"], w["bf"])
    # worker1 computes as torch would there; worker2 as its variable says
    for worker, n in (("worker1", rpc.rpc_sync("worker1", cf.torch_setting)), ("worker2", 1)):
        remote = (rpc.rpc_sync(worker, cf.cnn_python, args=(x,)) if kind == "python"
                  else rpc.rpc_sync(worker, cf.cnn_script, args=args))
        torch.set_num_threads(n)
        with torch.no_grad():
            local = cf.cnn_script(*args)
        assert torch.equal(remote, local), (
            f"{kind} CNN on {worker} ({n} intra-op threads) differs from torch's by "
            f"{(remote - local).abs().max().item():.3g}")


def test_workers_that_served_calls_use_no_cpu_while_idle():
    pid, x = rpc.rpc_sync("worker1", os.getpid), torch.ones(2)
    for _ in range(200):  # every wait site polls after activity
        rpc.rpc_sync("worker1", torch.add, args=(x, 1))
        rpc.rpc_sync("worker1", cf.this_thread_num_threads)
    time.sleep(0.5)  # the polls that follow activity end within milliseconds
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(2.0)
    used = cpu_seconds(pid) - before
    elapsed = time.monotonic() - started
    # Generous: 5% of a core (the clock tick is 10 ms); polling would use 100%.
    assert used < 0.05 * elapsed, f"idle worker1 used {used:.3f} s of CPU in {elapsed:.1f} s"
