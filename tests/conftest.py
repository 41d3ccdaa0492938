"""Test-wide fixtures: every hung test shows every rank's stack."""

import pytest

from tests.multiprocess import cluster


@pytest.fixture(autouse=True)
def _stacks_before_timeout(request):
    """Dumps the stacks of every live worker process shortly before
    pytest-timeout fails a hung test (which then dumps this process)."""
    limit = cluster.test_timeout(request.node)
    with cluster.watchdog(limit * 0.85 if limit else None):
        yield
