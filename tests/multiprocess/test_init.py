"""Joining and leaving a job: init methods, names, shutdown, re-init.

Each test starts its own small job (this process is rank 0), so these are the
suite's most expensive tests; they also prove that init_rpc works again in a
process after shutdown."""

import datetime
import inspect
import os
import signal
import subprocess
import threading
import time

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs
from tests.multiprocess.cluster import Cluster, free_port, spawn, worker_command


@pytest.mark.parametrize("init", ["tcp", "env", "file", "store"])
def test_init_methods_and_reinit(init):
    with Cluster(3, init=init) as job:
        assert rpc.get_worker_info().name == "worker0"
        assert [rpc.get_worker_info(n).id for n in job.names] == [0, 1, 2]
        assert torch.equal(rpc.rpc_sync("worker2", funcs.add, args=(torch.ones(1), torch.ones(1))),
                           torch.full((1,), 2.0))
        # the workers learnt their ranks from the same rendezvous
        assert rpc.rpc_sync("worker1", funcs.call, args=("worker2", rpc.get_worker_info)).id == 2
    assert not rpc.api._debug_info()["initialized"]


def test_a_program_spelled_for_torch_distributed_rpc_runs_unchanged():
    # init_rpc(backend=BackendType.TENSORPIPE, rpc_backend_options=
    # TensorPipeRpcBackendOptions(..., _transports=[...])) under env://, as torchrun starts it
    with Cluster(2, init="env", rpc_timeout=20.0, upstream_spelling=True):
        assert rpc.is_available()
        assert rpc.get_rpc_timeout() == 20.0
        assert rpc.rpc_sync("worker1", rpc.get_rpc_timeout) == 60.0  # that worker's own default
        assert torch.equal(rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1)), torch.full((2,), 2.0))


def test_init_twice_in_a_process_is_an_error():
    with Cluster(2):
        with pytest.raises(RuntimeError, match="already initialized in this process as 'worker0'"):
            rpc.init_rpc("again", rank=0, world_size=1)


def test_duplicate_name_is_rejected_naming_it(tmp_path):
    init_method = f"tcp://127.0.0.1:{free_port()}"
    log = tmp_path / "worker1.log"
    proc = spawn(worker_command(1, 2, init_method, name="worker0"), log)
    try:
        with pytest.raises(RuntimeError, match="worker name 'worker0' is not unique: ranks 0 and 1 both use it"):
            rpc.init_rpc("worker0", rank=0, world_size=2,
                         rpc_backend_options=rpc.RpcOptions(init_method=init_method, init_timeout=60))
        assert proc.wait(timeout=60) == 2
        assert "worker name 'worker0' is not unique: ranks 0 and 1" in log.read_text()
    finally:
        proc.kill()
    assert not rpc.api._debug_info()["initialized"]


def test_graceful_shutdown_waits_for_every_worker_and_keeps_serving():
    with Cluster(2).unmanaged() as job:
        # worker1 calls back into this process 1 s from now, then shuts down
        rpc.rpc_sync("worker1", funcs.stop_worker_later, args=(1.0, "worker0"))
        started = time.monotonic()
        rpc.shutdown(graceful=True, timeout=30)
        took = time.monotonic() - started
        assert took >= 0.9, f"shutdown returned after {took:.2f} s, before worker1 reached it"
        assert job.procs[1].wait(timeout=30) == 0
        assert "call back during shutdown returned 42" in job.log(1)
        assert "get_worker_info during shutdown returned worker0" in job.log(1), job.log(1)


def test_graceful_shutdown_by_default_waits_as_long_as_the_others_work():
    # Upstream's default (timeout=0: no limit), which a parameter server relies
    # on: it calls shutdown() at once and serves its trainers however long
    # they train. torchrpc gave up after 60 s. Here the other worker works
    # past this job's RPC timeout (2 s), which bounds only the steps after the meeting.
    import torch.distributed.rpc as upstream

    default = inspect.signature(rpc.shutdown).parameters["timeout"].default
    assert default == inspect.signature(upstream.shutdown).parameters["timeout"].default == 0
    with Cluster(2, rpc_timeout=2.0).unmanaged() as job:
        rpc.rpc_sync("worker1", funcs.stop_worker_later, args=(3.0, "worker0"))
        started = time.monotonic()
        rpc.shutdown()
        assert time.monotonic() - started >= 2.5
        assert job.procs[1].wait(timeout=30) == 0
        assert "call back during shutdown returned 42" in job.log(1)


def test_graceful_shutdown_does_not_wait_for_a_worker_that_stopped_without_meeting():
    # worker2 stops at once (graceful=False: it says goodbye, so no one saw it
    # die) and worker1 never talked to it: without a limit, both would wait
    # for it forever. Each dials it instead, finds it gone, and says so.
    with Cluster(3).unmanaged() as job:
        job.ask_to_stop(2, graceful=False)
        assert job.procs[2].wait(timeout=30) == 0
        rpc.rpc_sync("worker1", funcs.stop_worker, args=(True,))
        started = time.monotonic()
        # Whichever of the two dials it first tells the other through the store.
        with pytest.raises(rpc.PeerUnreachableError,
                           match=r"worker2 \(rank 2: (it cannot be reached|found dead by another worker)"):
            rpc.shutdown()
        assert time.monotonic() - started < 15
        job.procs[1].wait(timeout=30)
        assert "worker2" in job.log(1), job.log(1)


def test_ctrl_c_ends_a_graceful_shutdown_that_waits_for_the_others():
    with Cluster(2).unmanaged() as job:
        rpc.rpc_sync("worker1", funcs.stop_worker, args=(True,))  # waits there for this worker
        time.sleep(1.0)
        assert job.procs[1].poll() is None, job.log(1)
        job.procs[1].send_signal(signal.SIGINT)
        job.procs[1].wait(timeout=10)
        assert "KeyboardInterrupt" in job.log(1), job.log(1)
        # worker1 arrived and then stopped: the meeting goes on without it.
        with pytest.raises(rpc.PeerUnreachableError, match="worker1"):
            rpc.shutdown(timeout=30)


@pytest.mark.parametrize("init", ["tcp", "file"])
def test_ctrl_c_ends_init_rpc_waiting_for_the_job(init, tmp_path):
    # tcp://: ranks 0 (the store's host) and 1 of 3 wait for rank 2, which
    # never comes; torch's rank 0 waits in its store's constructor, deaf to
    # Ctrl-C. file://: rank 1 waits for rank 0, which never comes.
    import torch.distributed as dist

    port = free_port()
    init_method = f"tcp://127.0.0.1:{port}" if init == "tcp" else f"file://{tmp_path}/store"
    ranks = (0, 1) if init == "tcp" else (1,)
    procs = [spawn(worker_command(rank, 3, init_method), tmp_path / f"worker{rank}.log") for rank in ranks]
    try:
        if init == "tcp":
            rpc.rendezvous._wait_for_store_host(init_method, 60)
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
            store.wait(["torchrpc/0/worker/0", "torchrpc/0/worker/1"])  # both published their address: they wait
        else:
            deadline = time.monotonic() + 60
            while not (tmp_path / "store").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        time.sleep(0.5)
        for proc in procs:
            assert proc.poll() is None, [p.read_text() for p in tmp_path.glob("*.log")]
            proc.send_signal(signal.SIGINT)
        for rank, proc in zip(ranks, procs):
            proc.wait(timeout=10)
            log = (tmp_path / f"worker{rank}.log").read_text()
            assert "KeyboardInterrupt" in log and "init_rpc" in log, log
    finally:
        for proc in procs:
            proc.kill()


def test_init_rpc_timeout_says_who_did_not_join():
    with pytest.raises(RuntimeError, match=r"init_rpc on worker0: not every worker of the job \(world_size=2\) "
                                           r"joined within the rendezvous timeout of 1\.0+ s .*rank\(s\) 1 did not"):
        rpc.init_rpc("worker0", rank=0, world_size=2,
                     rpc_backend_options=rpc.RpcOptions(init_method=f"tcp://127.0.0.1:{free_port()}", init_timeout=1))
    assert not rpc.api._debug_info()["initialized"]


def test_non_graceful_shutdown_is_local_and_fails_pending_calls():
    with Cluster(2).unmanaged() as job:
        fut = rpc.rpc_async("worker1", funcs.sleep, args=(10,))
        time.sleep(0.2)
        started = time.monotonic()
        rpc.shutdown(graceful=False)
        assert time.monotonic() - started < 5
        with pytest.raises(rpc.ShutdownError, match="worker1"):
            fut.wait()
        with pytest.raises(rpc.NotInitializedError, match="init_rpc"):
            rpc.rpc_sync("worker1", funcs.pid)


def test_shutdown_does_not_wait_forever_for_a_completion_callback(capfd):
    with Cluster(2).unmanaged():
        release, running = threading.Event(), threading.Event()

        def stuck(_):
            running.set()
            release.wait(30)

        # The call outlasts then(): on a future already done, it would run stuck here.
        rpc.rpc_async("worker1", funcs.sleep, args=(0.5,)).then(stuck)
        assert running.wait(10)
        started = time.monotonic()
        rpc.shutdown(graceful=False, timeout=1)
        took = time.monotonic() - started
        release.set()
        assert took < 5, f"shutdown took {took:.1f} s with a callback that does not return"
        assert "completion callbacks were still running 1 s after shutdown began" in capfd.readouterr().err


def test_graceful_shutdown_timeout_names_what_is_missing():
    with Cluster(2).unmanaged() as job:
        started = time.monotonic()
        with pytest.raises(rpc.RpcTimeoutError, match="not every worker reached shutdown within 1"):
            rpc.shutdown(graceful=True, timeout=1)
        assert time.monotonic() - started < 10
        assert not rpc.api._debug_info()["initialized"]


def test_graceful_shutdown_says_when_the_store_host_is_gone(tmp_path):
    # Here this process is rank 1: rank 0, which hosts the tcp:// store, exits
    # without shutdown(). Meeting the others is then impossible, at once.
    init_method = f"tcp://127.0.0.1:{free_port()}"
    proc = spawn(worker_command(0, 2, init_method), tmp_path / "worker0.log")
    try:
        rpc.init_rpc("worker1", rank=1, world_size=2,
                     rpc_backend_options=rpc.RpcOptions(init_method=init_method, init_timeout=60))
        rpc.rpc_async("worker0", os._exit, args=(3,))
        assert proc.wait(timeout=30) == 3
        started = time.monotonic()
        with pytest.raises(rpc.PeerUnreachableError,
                           match=r"(?s)the rendezvous store stopped answering.*rank 0 \(worker0\) hosts it.*"
                                 r"shutdown\(graceful=False\)"):
            rpc.shutdown(graceful=True, timeout=30)
        assert time.monotonic() - started < 10
        assert not rpc.api._debug_info()["initialized"]
    finally:
        proc.kill()
