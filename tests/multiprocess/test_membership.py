"""Dynamic membership: init_rpc without a world_size.

Workers join a running job and leave it one by one; the members call a new
worker and it calls them; a call to a worker that left fails naming it; a
worker's shutdown does not wait for the others; static and dynamic workers
cannot share a rendezvous store.

This process is the job's first worker (rank 0, hosting the tcp:// store); the
tests run in order against one job, each adding or removing workers.
"""

import datetime
import os
import shutil
import signal
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

import torchrpc as rpc
from tests.multiprocess import funcs, probes
from tests.multiprocess.cluster import free_port, spawn, worker_command

JOIN_TIMEOUT = 60.0
GRACE_SECONDS = "0.5"  # how long this worker keeps a lost peer (TORCHRPC_PEER_GRACE_SECONDS)
ONE = torch.ones(2)


class DynamicJob:
    """A dynamic job over tcp://: this process joins first; join() starts a
    worker process that joins it (world_size 0 means none: dynamic)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="torchrpc-members-")
        self.port = free_port()
        self.init_method = f"tcp://127.0.0.1:{self.port}"
        self.procs = {}  # key (the name, unless given) -> Popen

    def log(self, key):
        with open(os.path.join(self.dir, f"{key}.log")) as f:
            return f.read()

    def join(self, rank, name=None, world_size=0, init_method=None, key=None):
        name = name or f"worker{rank}"
        key = key or name
        cmd = worker_command(rank, world_size, init_method or self.init_method, name=name)
        self.procs[key] = spawn(cmd, os.path.join(self.dir, f"{key}.log"))
        return self.procs[key]

    def exit_code(self, key, timeout=JOIN_TIMEOUT):
        return self.procs[key].wait(timeout=timeout)

    def stop(self, name):
        """Asks worker `name` to shut down gracefully; returns its exit code."""
        rpc.rpc_sync(name, funcs.stop_worker, args=(True,))
        return self.exit_code(name)

    def kill_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def names_now():
    return [w.name for w in rpc.api._get_current_rpc_agent().get_worker_infos()]


def wait_for_members(expected, timeout=JOIN_TIMEOUT, job=None, joiner=None):
    """Waits until this worker's table lists exactly `expected` (a worker's
    init_rpc returns once every member knows it, so this ends as it does).
    A failure shows the log of `joiner`, the worker of `job` expected to join."""
    deadline = time.monotonic() + timeout
    while names_now() != expected:
        if time.monotonic() >= deadline:
            log = f"\n{joiner}'s log:\n{job.log(joiner)}" if joiner else ""
            raise AssertionError(f"members: {names_now()}, waited for {expected}{log}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def job():
    j = DynamicJob()
    saved = os.environ.get("TORCHRPC_PEER_GRACE_SECONDS")
    os.environ["TORCHRPC_PEER_GRACE_SECONDS"] = GRACE_SECONDS  # read by init_rpc
    try:
        rpc.init_rpc("worker0", rank=0,
                     rpc_backend_options=rpc.RpcOptions(init_method=j.init_method, rpc_timeout=20, init_timeout=30))
        if saved is None:
            del os.environ["TORCHRPC_PEER_GRACE_SECONDS"]
        else:
            os.environ["TORCHRPC_PEER_GRACE_SECONDS"] = saved
        yield j
        try:
            for name, proc in j.procs.items():
                if proc.poll() is None:
                    assert j.stop(name) == 0, j.log(name)
        except BaseException:
            # A session left running here would fail every later test of this process.
            rpc.shutdown(graceful=False)
            raise
        rpc.shutdown()
    finally:
        j.kill_all()


def test_a_job_without_world_size_starts_with_one_worker(job):
    assert names_now() == ["worker0"]
    assert torch.equal(rpc.rpc_sync("worker0", torch.add, args=(ONE, 1)), ONE + 1)


def test_members_and_a_new_worker_call_each_other(job):
    job.join(1)
    wait_for_members(["worker0", "worker1"])
    assert rpc.get_worker_info("worker1").id == 1
    assert torch.equal(rpc.rpc_sync("worker1", funcs.add, args=(ONE, ONE)), ONE * 2)
    # and back: the new worker calls a member it found as it joined
    assert torch.equal(rpc.rpc_sync("worker1", funcs.call, args=("worker0", torch.add, (ONE, 2))), ONE + 2)
    assert rpc.rpc_sync("worker1", funcs.worker_names) == ["worker0", "worker1"]


def test_every_member_learns_of_a_later_worker(job):
    job.join(2)
    wait_for_members(["worker0", "worker1", "worker2"])
    # worker1 was in the job before worker2: it was told, and calls it
    assert rpc.rpc_sync("worker1", funcs.worker_names) == ["worker0", "worker1", "worker2"]
    assert torch.equal(rpc.rpc_sync("worker1", funcs.call, args=("worker2", torch.add, (ONE, 3))), ONE + 3)
    assert torch.equal(rpc.rpc_sync(2, torch.mul, args=(ONE, 4)), ONE * 4)


def test_a_worker_leaves_alone_and_calls_to_it_fail_naming_it(job):
    departed = rpc.get_worker_info("worker2")
    running = rpc.rpc_async("worker2", funcs.sleep, args=(1.0,))
    # its graceful shutdown waits for nobody: worker0 and worker1 keep running
    assert job.stop("worker2") == 0, job.log("worker2")
    # but it answers what it was asked before it says goodbye
    assert running.wait() == 1.0
    assert names_now() == ["worker0", "worker1"]
    assert rpc.rpc_sync("worker1", funcs.worker_names) == ["worker0", "worker1"]
    for to in ("worker2", 2, departed):
        with pytest.raises(rpc.PeerUnreachableError, match=r"worker2 \(rank 2\) left the job"):
            rpc.rpc_sync(to, torch.add, args=(ONE, 1))
    kind, message = rpc.rpc_sync("worker1", funcs.call_expect_error, args=("worker2", torch.add, (ONE, 1)))
    assert kind == "PeerUnreachableError" and "worker2 (rank 2) left the job" in message
    assert rpc.api._debug_info()["pending_requests"] == 0


@pytest.mark.parametrize("rank, name, clash", [(5, "worker1", "name"), (1, "other", "rank")])
def test_a_name_or_rank_in_use_cannot_join(job, rank, name, clash):
    key = f"same-{clash}"
    job.join(rank, name=name, key=key)
    assert job.exit_code(key) == 2
    assert f"RuntimeError: worker '{name}' (rank {rank}) cannot join the job: its {clash} is not unique" in job.log(key)
    assert names_now() == ["worker0", "worker1"]  # the job goes on, and can take others


def test_a_worker_that_left_can_join_again(job):
    job.join(2)
    wait_for_members(["worker0", "worker1", "worker2"])
    assert torch.equal(rpc.rpc_sync("worker1", funcs.call, args=("worker2", torch.add, (ONE, 5))), ONE + 5)
    assert rpc.rpc_sync("worker2", funcs.worker_names) == ["worker0", "worker1", "worker2"]


def test_a_worker_that_died_is_dropped_by_the_members_and_by_the_next_joiner(job):
    job.join(3)
    wait_for_members(["worker0", "worker1", "worker2", "worker3"])
    # Members know of a joiner before its init_rpc returns: wait for that, so
    # that it dies a listed member (the next test kills one while it joins).
    assert rpc.rpc_sync("worker3", funcs.main_thread_runs)
    job.procs["worker3"].kill()
    job.procs["worker3"].wait(timeout=10)
    # this worker lost its connection to worker3 without a goodbye: after the
    # grace period (GRACE_SECONDS here) it finds it unreachable and drops it
    wait_for_members(["worker0", "worker1", "worker2"])
    with pytest.raises(rpc.PeerUnreachableError, match=r"worker3 \(rank 3\) stopped without leaving the job"):
        rpc.rpc_sync("worker3", torch.add, args=(ONE, 1))
    # worker3 is still listed in the store: the next worker to join finds it
    # unreachable and drops it from the list, and joins
    job.join(4)
    wait_for_members(["worker0", "worker1", "worker2", "worker4"], job=job, joiner="worker4")
    assert rpc.rpc_sync("worker4", funcs.worker_names) == ["worker0", "worker1", "worker2", "worker4"]
    assert "dropping rank 3 from the job's members" in job.log("worker4")


def test_a_worker_killed_while_it_joins_blocks_no_later_join(job):
    # The joiner takes the job's membership token, then waits for every
    # member's answer: with worker1 stopped, worker5 holds it while it dies.
    store = dist.TCPStore("127.0.0.1", job.port, is_master=False, timeout=datetime.timedelta(seconds=30))
    worker1 = job.procs["worker1"].pid
    probes.stop(worker1)
    try:
        job.join(5)
        deadline = time.monotonic() + JOIN_TIMEOUT
        while not store.get("torchrpc/dynamic/token").startswith(b"worker5 (rank 5) joining"):
            assert time.monotonic() < deadline, job.log("worker5")
            time.sleep(0.02)
        job.procs["worker5"].kill()
        job.procs["worker5"].wait(timeout=10)
    finally:
        os.kill(worker1, signal.SIGCONT)
    # The next joiner finds the holder gone and takes the token over.
    started = time.monotonic()
    job.join(6)
    wait_for_members(["worker0", "worker1", "worker2", "worker4", "worker6"], job=job, joiner="worker6")
    assert time.monotonic() - started < 30  # not the store's timeout
    assert "took over the job's membership token from worker5 (rank 5) joining" in job.log("worker6")
    assert rpc.rpc_sync("worker6", funcs.worker_names)[-1] == "worker6"
    assert torch.equal(rpc.rpc_sync("worker1", funcs.call, args=("worker6", torch.add, (ONE, 6))), ONE + 6)


def test_a_static_worker_cannot_join_a_dynamic_job(job):
    before = names_now()
    job.join(3, name="static3", world_size=4)
    assert job.exit_code("static3") == 2
    log = job.log("static3")
    assert "RuntimeError: RPC group mixes statically and dynamically initialized members" in log, log
    assert names_now() == before


def test_a_dynamic_worker_cannot_join_a_static_job(job):
    # A static job of one worker, on a store of its own.
    port = free_port()
    static_init = f"tcp://127.0.0.1:{port}"
    job.join(0, name="solo", world_size=1, init_method=static_init)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    store.wait(["torchrpc/kind"])  # the static worker claimed the store
    job.join(1, name="joiner", init_method=static_init)
    assert job.exit_code("joiner") == 2
    assert "RPC group mixes statically and dynamically initialized members" in job.log("joiner")
    job.procs["solo"].kill()
    job.procs["solo"].wait(timeout=10)
    del store
