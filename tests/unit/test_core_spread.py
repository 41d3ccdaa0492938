"""Pool threads that serve long tasks keep to different cores
(csrc/agent/core_spread.h): a thread that finds another pool thread on its
core moves to a core that has none, and says so when there is none."""

import ctypes
import os
import threading

import pytest

from tests.csrc import hooks

ALLOWED = os.sched_getaffinity(0)
sched_getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu


def settle_in_turn(n):
    """n threads, one after the other, start on the lowest allowed core and
    settle (staying counted until all have); returns each one's (core, alone)."""
    spread = hooks().CoreSpread()
    out, turn, done = [None] * n, [threading.Event() for _ in range(n + 1)], threading.Event()

    def thread(i):
        assert turn[i].wait(10)
        os.sched_setaffinity(0, {min(ALLOWED)})  # this thread only
        os.sched_setaffinity(0, ALLOWED)
        alone = spread.settle()
        out[i] = (sched_getcpu(), alone)
        turn[i + 1].set()
        assert done.wait(10)
        hooks().CoreSpread.leave()

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    turn[0].set()
    assert turn[n].wait(10)
    done.set()
    for t in threads:
        t.join(10)
    return out


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 cores to spread over")
def test_threads_that_start_on_one_core_end_on_different_cores():
    spread = settle_in_turn(len(ALLOWED) + 1)
    first = spread[:len(ALLOWED)]
    assert sorted(core for core, _ in first) == sorted(ALLOWED), spread
    assert all(alone for _, alone in first), spread
    # one thread more than cores: nowhere to go, and it knows
    assert spread[-1][1] is False, spread


def test_a_thread_alone_on_its_core_stays():
    [(core, alone)] = settle_in_turn(1)
    assert alone and core in ALLOWED
