"""The request pool (csrc/agent/thread_pool.h): at most `cap` threads run
fresh tasks at once, and a task queued behind blocked ones still runs."""

import statistics

import pytest

from tests.csrc import hooks


@pytest.mark.parametrize("cap", [1, 2])
def test_a_burst_of_short_tasks_runs_on_at_most_cap_threads(cap):
    # 64 tasks of 200 us queued at once on 8 threads: waking a thread for
    # each would run 8 at once. The pool counts a task as stalled after
    # 50 ms here (1 ms in a worker), so that a busy machine, which can hold
    # a task's thread off its core for milliseconds, cannot make it wake
    # another; the median of 3 runs allows for a longer hold-up.
    runs = [hooks().pool_most_at_once(8, cap, 64, 200, 50_000) for _ in range(3)]
    assert statistics.median(runs) == cap, f"tasks at once in 3 runs with a cap of {cap}: {runs}"


@pytest.mark.parametrize("cap, blockers", [(1, 1), (2, 2), (2, 5)])
def test_a_task_queued_behind_blocked_ones_runs(cap, blockers):
    # The blockers fill the cap and wait for the task queued after them: the
    # pool must run it on another thread once it sees no progress (1 ms),
    # or the blockers wait forever.
    seconds = hooks().pool_blocked_until_a_queued_task(8, cap, blockers, 10.0)
    assert seconds >= 0, f"{blockers} blocked tasks with a cap of {cap}: the task they wait for never ran"
    assert seconds < 2.0, f"the task the blockers waited for ran only after {seconds:.3f} s"
