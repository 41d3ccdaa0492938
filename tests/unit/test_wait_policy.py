"""The wait policy (csrc/common/wait_policy.h): when a waiting thread may poll.

Its two rules are fed made-up measurements; a policy with a fake sampler and
the test's own clock shows when it samples, what it counts as work and how it
holds off; and one real sample of this host, taken while a busy process runs
on every core, shows that the policy then lets no thread poll."""

import os
import subprocess
import sys

import pytest

from tests.csrc import hooks

MS = 1000  # the hooks take microseconds


# ---- rule 1: a free core, now ----------------------------------------------------

@pytest.mark.parametrize(
    "runnable, other_pollers, our_pollers, cores, free",
    [
        (1, 0, 0, 2, True),    # an idle host: only the sampling thread runs
        (2, 0, 0, 2, True),    # one thread computes on 2 cores: the other core is free
        (3, 0, 0, 2, False),   # a 2-thread compute loop fills both cores
        (5, 2, 2, 2, True),    # pollers, ours or other processes', are not work
        (5, 1, 1, 2, False),   # 2 threads of work besides the pollers and the sampler
        (17, 0, 0, 16, False),  # 16 threads of work fill a 16-core host (the 17th is the sampler)
        (-1, 0, 0, 2, True),   # no measurement (no /proc/loadavg): poll as before
    ],
)
def test_core_free(runnable, other_pollers, our_pollers, cores, free):
    assert hooks().wait_core_free(runnable, other_pollers, our_pollers, cores) is free


# ---- rule 2: polls that kept their core --------------------------------------------

@pytest.mark.parametrize(
    "waited_us, arrivals, lost",
    [
        (0, 0, False),      # nothing else wanted the core
        (300, 10, False),   # yields to threads that ran 30 µs each: free
        (200, 1, False),    # one short wait
        (1500, 1, True),    # another thread's scheduler slice
        (3000, 4, True),    # slices, more than once
        (3000, 30, False),  # many short waits (100 µs each)
    ],
)
def test_lost_core(waited_us, arrivals, lost):
    assert hooks().wait_lost_core(waited_us, arrivals) is lost


# ---- the policy over time, with a fake host ------------------------------------------

class FakeHost:
    """Returns (runnable, other_pollers) and counts the samples taken."""

    def __init__(self, runnable=1, other_pollers=0):
        self.runnable, self.other_pollers, self.samples = runnable, other_pollers, 0

    def __call__(self):
        self.samples += 1
        return self.runnable, self.other_pollers


def test_samples_at_most_once_per_check_interval():
    host = FakeHost()
    policy = hooks().WaitPolicy(2, host)
    for now in (0, 500, 1999):
        assert policy.enter(now)
        policy.leave()
    assert host.samples == 1
    assert policy.enter(2 * MS)
    policy.leave()
    assert host.samples == 2


def test_work_on_every_core_stops_polls_until_a_sample_sees_a_core_free():
    host = FakeHost(runnable=3)  # the sampler + 2 threads of work on 2 cores
    policy = hooks().WaitPolicy(2, host)
    assert not policy.enter(0)
    host.runnable = 1
    assert not policy.enter(1 * MS)  # the verdict stands until the next sample
    assert policy.enter(2 * MS)
    assert policy.pollers == 1
    policy.leave()
    assert policy.pollers == 0


def test_a_poll_stops_at_the_first_sample_that_sees_work_woken_since_it_began():
    host = FakeHost()
    policy = hooks().WaitPolicy(2, host)
    assert policy.enter(0)  # granted on an idle host
    host.runnable = 3  # a 2-thread compute loop wakes up beside the poller
    assert policy.keep(1 * MS)  # no sample due yet: the poll goes on
    assert not policy.keep(2 * MS)  # the next sample sees the work
    policy.leave()
    assert policy.pollers == 0 and not policy.enter(3 * MS)


def test_a_poll_goes_on_while_only_pollers_and_the_poller_itself_run():
    host = FakeHost()
    policy = hooks().WaitPolicy(2, host)
    assert policy.enter(0) and policy.enter(0)
    host.runnable = 2  # the two pollers themselves
    assert policy.keep(2 * MS) and policy.keep(4 * MS)
    assert host.samples == 3


def test_a_poll_counts_itself_once_when_it_asks_again():
    host = FakeHost()
    policy = hooks().WaitPolicy(2, host)
    assert policy.enter(0) and policy.enter(0)
    host.runnable = 3  # the two pollers and one thread of work: a core is free
    assert policy.keep(2 * MS)
    host.runnable = 4  # two threads of work fill both cores
    assert not policy.keep(4 * MS)


def test_own_pollers_are_not_work():
    host = FakeHost()
    policy = hooks().WaitPolicy(2, host)
    assert policy.enter(0) and policy.enter(0)  # two threads poll
    host.runnable = 3  # those two and the sampler
    assert policy.enter(2 * MS)
    assert policy.pollers == 3


def test_a_probe_that_lost_its_core_holds_polls_off_with_back_off():
    policy = hooks().WaitPolicy(2, FakeHost())
    policy.probed(0, 1500, 1)  # lost its core at t=0: 20 ms off
    assert not policy.enter(19 * MS)
    assert policy.enter(20 * MS)
    policy.leave()
    policy.probed(20 * MS, 2000, 1)  # again: 40 ms off
    assert not policy.enter(59 * MS)
    assert policy.enter(60 * MS)
    policy.leave()
    policy.probed(60 * MS, 0, 0)  # a clean probe ends the back-off
    policy.probed(61 * MS, 1500, 1)
    assert not policy.enter(80 * MS)
    assert policy.enter(81 * MS)
    policy.leave()


# ---- this host --------------------------------------------------------------------

def test_no_polls_while_a_busy_process_runs_on_every_core():
    runnable, others, cores, measures = hooks().host_wait_sample()
    assert measures and runnable >= 1 and others >= 0 and cores == os.cpu_count()
    busy = [subprocess.Popen([sys.executable, "-c", "print(flush=True)\nwhile True: pass"],
                             stdout=subprocess.PIPE) for _ in range(cores)]
    try:
        for proc in busy:
            proc.stdout.readline()  # it runs
        runnable, others, _, _ = hooks().host_wait_sample()
        assert runnable >= cores + 1  # the busy processes and this thread
        assert not hooks().wait_core_free(runnable, others, 0, cores)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
            proc.stdout.close()
