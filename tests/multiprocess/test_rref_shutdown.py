"""Graceful shutdown with RRefs still referenced: every worker releases its
user RRefs (the owners free their values) and reports owner RRefs that still
have users afterwards (leaks)."""

import pytest

import torchrpc as rpc
from tests.multiprocess import rref_funcs
from tests.multiprocess.cluster import Cluster


def test_graceful_shutdown_releases_users_and_reports_leaks():
    job = Cluster(2).__enter__()
    try:
        kept = rpc.RRef(rref_funcs.Tracked("kept", 1))
        # worker1 still holds a user RRef of ours when the job shuts down
        assert rpc.rpc_sync("worker1", rref_funcs.store_rref, args=("kept", kept)) is False
        assert len(rpc.rref._live_rrefs()["owners"]) == 1
        remote_kept = rpc.remote("worker1", rref_funcs.Tracked, args=("remote", 2))
        assert remote_kept.to_here().payload == 2
        # a fork that no worker will ever receive: the one real leak
        leaked = rpc.RRef("leaked")
        fork = leaked._fork()
    except BaseException:
        job.__exit__(None, None, None)
        raise
    with pytest.warns(ResourceWarning, match=r"1 owner RRef\(s\).*leaked.*" + f"{fork[3]}:{fork[4]}"):
        job.__exit__(None, None, None)  # raises if a worker did not exit cleanly
    assert "leaked" not in job.log(1)  # worker1 owned only remote_kept, released by us
    # remote_kept was released by the graceful shutdown: as upstream, it says so
    with pytest.raises(RuntimeError, match=r"Cannot call to_here\(\) on it after deletion"):
        remote_kept.to_here()
