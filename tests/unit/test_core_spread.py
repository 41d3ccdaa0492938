"""Pool threads that serve long tasks keep to different cores
(csrc/agent/core_spread.h): a thread that finds another pool thread on its
core moves to a core that has none, and says so when there is none."""

import os

import pytest

from torchrpc import _C

CORES = len(os.sched_getaffinity(0))


@pytest.mark.skipif(CORES < 2, reason="needs 2 cores to spread over")
def test_threads_that_start_on_one_core_end_on_different_cores():
    spread = _C._spread_threads_for_test(CORES + 1)
    first = spread[:CORES]
    assert sorted(core for core, _ in first) == sorted(os.sched_getaffinity(0)), spread
    assert all(alone for _, alone in first), spread
    # one thread more than cores: nowhere to go, and it knows
    assert spread[-1][1] is False, spread


def test_a_thread_alone_on_its_core_stays():
    [(core, alone)] = _C._spread_threads_for_test(1)
    assert alone and core in os.sched_getaffinity(0)
