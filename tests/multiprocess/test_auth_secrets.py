"""A job whose workers hold different secrets (RpcOptions(secret=...) or
TORCHRPC_SECRET): the workers that share one talk; a call to the odd one out
fails at once with an error that names it and says why."""

import pytest

import torchrpc as rpc
from tests.multiprocess import funcs
from tests.multiprocess.cluster import Cluster


def test_calls_between_workers_with_different_secrets_fail_naming_the_peer(monkeypatch):
    monkeypatch.setenv("TORCHRPC_SECRET", "a" * 32)
    job = Cluster(3, worker_env={1: {"TORCHRPC_SECRET": "a" * 32}, 2: {"TORCHRPC_SECRET": "b" * 32}})
    with job.unmanaged():
        try:
            assert rpc.rpc_sync("worker1", funcs.pid) > 0
            with pytest.raises(rpc.PeerUnreachableError, match="worker2.*handshake failed.*secret"):
                rpc.rpc_sync("worker2", funcs.pid, timeout=10)
        finally:
            rpc.shutdown(graceful=False)
