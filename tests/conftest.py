"""Test-wide fixtures: every hung test shows every rank's stack; a module
leaves no torchrpc session running; one AOTInductor package cache for the
session."""

import gc
import os

import pytest

import torchrpc
from torchrpc import state
from tests.multiprocess import cluster


@pytest.fixture(autouse=True)
def _stacks_before_timeout(request):
    """Dumps the stacks of every live worker process shortly before
    pytest-timeout fails a hung test (which then dumps this process), and
    ends the run if pytest-timeout cannot."""
    limit = cluster.test_timeout(request.node)
    grace = float(os.environ.get("TORCHRPC_TEST_GRACE_S", 0)) or max(10.0, (limit or 0) / 4)
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with cluster.watchdog(limit * 0.85 if limit else None, give_up=limit + grace if limit else None,
                          uncapture=lambda: capture.suspend_global_capture(in_=True), what=request.node.nodeid):
        yield


@pytest.fixture(autouse=True, scope="module")
def _old_objects_frozen():
    """Moves what earlier modules left to the collector's permanent generation:
    tests that collect garbage (to drop RRefs at once) then scan only their
    own objects, not torch's and pytest's (150-400 ms a full collection)."""
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(autouse=True, scope="module")
def _no_session_left():
    """A module whose teardown failed may leave this process's session
    running, and every later init_rpc here would fail on it: stopped here,
    and reported as this module's error."""
    yield
    session = state.current()
    if session is not None:
        torchrpc.shutdown(graceful=False)
        pytest.fail(f"this module left torchrpc running as {session.me.name!r}; stopped it (graceful=False)")


@pytest.fixture(scope="session")
def aoti_cache(tmp_path_factory):
    """A package cache (TORCHRPC_AOTI_CACHE) the session's modules share, so
    a program two modules export is compiled once (10-30 s here)."""
    return str(tmp_path_factory.mktemp("aoti"))
