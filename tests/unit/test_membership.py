"""Dynamic membership in one process: the argument checks of a job without a
world_size, a worker alone in one, and a store that a job of the other kind
holds (static and dynamic workers cannot mix). Joins and leaves across
processes: tests/multiprocess/test_membership.py."""

import datetime

import pytest
import torch
import torch.distributed as dist

import torchrpc
from torchrpc import rendezvous, state

MIXES = "RPC group mixes statically and dynamically initialized members which is not supported"


def options(**kw):
    return torchrpc.RpcOptions(rpc_timeout=10, init_timeout=10, **kw)


@pytest.mark.parametrize("init_method, phrase", [
    ("file:///tmp/unused", "rank parameter missing"),
    ("tcp://127.0.0.1:1", "rank parameter missing"),
    ("env://", "environment variable RANK expected"),
])
def test_a_missing_rank_says_so_in_torchs_words(monkeypatch, init_method, phrase):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=phrase):
        torchrpc.init_rpc("w", rpc_backend_options=options(init_method=init_method))
    assert state.current() is None


def test_rank_and_world_size_checks():
    with pytest.raises(ValueError, match=r"rank in \[0, 32767\]"):
        rendezvous._check_rank(options(init_method="tcp://h:1"), 32768, None)
    with pytest.raises(ValueError, match="use world_size >= 1, or None"):
        rendezvous._check_rank(options(init_method="tcp://h:1"), 0, 0)
    with pytest.raises(ValueError, match="must be smaller than world_size=2"):
        rendezvous._check_rank(options(init_method="tcp://h:1"), 2, 2)
    rendezvous._check_rank(options(init_method="tcp://h:1"), 32767, None)  # a dynamic job's last rank


def test_rank_ranges_in_errors():
    assert state._ranges([0, 1, 2, 3, 5, 7, 8]) == "0..3, 5, 7..8"
    assert state._ranges([4]) == "4"


def test_a_worker_alone_in_a_dynamic_job(tmp_path):
    torchrpc.init_rpc("first", rank=3, rpc_backend_options=options(init_method=f"file://{tmp_path}/store"))
    try:
        agent = torchrpc.api._get_current_rpc_agent()
        assert agent.get_worker_infos() == [torchrpc.WorkerInfo("first", 3)]
        assert agent.get_worker_info().id == 3
        assert torch.equal(torchrpc.rpc_sync(3, torch.add, args=(torch.ones(1), 1)), torch.full((1,), 2.0))
        with pytest.raises(ValueError, match=r"no worker has rank 0; ranks are 3"):
            torchrpc.rpc_sync(0, torch.add, args=(torch.ones(1), 1))
    finally:
        torchrpc.shutdown()  # leaves alone: nobody else to wait for


def test_a_store_held_by_a_static_job_refuses_a_dynamic_worker(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), -1)
    store.set_timeout(datetime.timedelta(seconds=10))
    store.set("torchrpc/kind", "static")
    with pytest.raises(RuntimeError, match=MIXES):
        torchrpc.init_rpc("late", rank=1, rpc_backend_options=options(store=store))
    assert state.current() is None


def test_a_static_job_that_ended_gives_its_store_back(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), -1)
    store.set_timeout(datetime.timedelta(seconds=10))
    torchrpc.init_rpc("static0", rank=0, world_size=1, rpc_backend_options=options(store=store))
    torchrpc.shutdown()
    # a dynamic job may use it now, and holds it while it runs
    torchrpc.init_rpc("dynamic0", rank=0, rpc_backend_options=options(store=store))
    try:
        assert store.get("torchrpc/kind") == b"dynamic"
    finally:
        torchrpc.shutdown()
    assert store.get("torchrpc/kind") == b""  # its last worker gave it back as it left
