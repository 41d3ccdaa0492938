"""Test-wide fixtures: every hung test shows every rank's stack; one
AOTInductor package cache for the session."""

import pytest

from tests.multiprocess import cluster


@pytest.fixture(autouse=True)
def _stacks_before_timeout(request):
    """Dumps the stacks of every live worker process shortly before
    pytest-timeout fails a hung test (which then dumps this process)."""
    limit = cluster.test_timeout(request.node)
    with cluster.watchdog(limit * 0.85 if limit else None):
        yield


@pytest.fixture(scope="session")
def aoti_cache(tmp_path_factory):
    """A package cache (TORCHRPC_AOTI_CACHE) the session's modules share, so
    a program two modules export is compiled once (10-30 s here)."""
    return str(tmp_path_factory.mktemp("aoti"))
