"""The wait policy (csrc/common/wait_policy.h): when a waiting thread may poll.

Its rules are fed made-up measurements; a policy with a fake sampler and the
test's own clock shows when it samples, what it counts as work, how it holds
off, and that a job alone on the host polls whatever rules 1 and 2 say. Real
samples of this host show that the policy lets no thread poll while a busy
process runs on every core, and that it counts that process as another
group's CPU; and processes started in this session and in a session of their
own show which of them the table of torchrpc processes puts in this one's
group."""

import mmap
import os
import pathlib
import struct
import subprocess
import sys
import time

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
    """Returns (runnable, other_pollers, others_cores) and counts the samples taken."""

    def __init__(self, runnable=1, other_pollers=0, others_cores=-1.0):
        self.runnable, self.other_pollers, self.others_cores = runnable, other_pollers, others_cores
        self.samples = 0

    def __call__(self):
        self.samples += 1
        return self.runnable, self.other_pollers, self.others_cores


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


# ---- rule 0: the job alone -----------------------------------------------------------

@pytest.mark.parametrize(
    "others_cores, alone",
    [
        (-1.0, False),  # no window yet (or a stale one): rules 1 and 2 decide
        (0.0, True),    # only this group used the CPU
        (0.1, True),    # a tick of the system's own threads
        (0.2, False),   # another group's work
        (1.5, False),
    ],
)
def test_job_alone(others_cores, alone):
    host = FakeHost(runnable=5, others_cores=others_cores)  # rule 1 alone would refuse: 3 threads of work
    policy = hooks().WaitPolicy(2, host)
    assert policy.enter(0) is alone


def test_alone_polls_go_on_whatever_rule_1_finds_and_stop_when_another_group_works():
    # A job in one session on 2 cores: 5 runnable threads, all its own.
    host = FakeHost(runnable=5, others_cores=0.0)
    policy = hooks().WaitPolicy(2, host)
    assert policy.enter(0) and policy.keep(2 * MS)
    host.others_cores = 1.0  # a loop in another session starts
    assert not policy.keep(4 * MS)
    policy.leave()
    assert not policy.enter(6 * MS) and policy.withheld == 2


def test_alone_a_probe_that_waited_a_slice_holds_nothing_off():
    # Alone, the core went to a thread of the job's own, which the yield let in.
    host = FakeHost(runnable=1, others_cores=0.0)
    policy = hooks().WaitPolicy(2, host)
    assert policy.enter(0)
    policy.leave()
    policy.probed(0, 1500, 1)
    assert policy.enter(1 * MS)
    policy.leave()
    host.others_cores = 1.0  # not alone: the same probe holds polls off
    assert policy.enter(2 * MS)
    policy.leave()
    policy.probed(2 * MS, 1500, 1)
    assert not policy.enter(3 * MS)


# ---- this host --------------------------------------------------------------------

def test_no_polls_while_a_busy_process_runs_on_every_core():
    runnable, others, cores, measures, _ = hooks().host_wait_sample()
    assert measures and runnable >= 1 and others >= 0 and cores == os.cpu_count()
    busy = [subprocess.Popen([sys.executable, "-c", "print(flush=True)\nwhile True: pass"],
                             stdout=subprocess.PIPE) for _ in range(cores)]
    try:
        for proc in busy:
            proc.stdout.readline()  # it runs
        runnable, others, _, _, _ = hooks().host_wait_sample()
        assert runnable >= cores + 1  # the busy processes and this thread
        assert not hooks().wait_core_free(runnable, others, 0, cores)
        # Rule 0 counts them as another group's CPU (they are no torchrpc
        # process of this group): samples over a few windows of 100 ms.
        seen = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            seen.append(hooks().host_wait_sample()[4])
            time.sleep(0.01)
        measured = [c for c in seen if c >= 0]
        assert measured and max(measured) >= 0.5, f"other groups' cores over the windows: {measured}"
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
            proc.stdout.close()


def test_group_key_knows_the_default_autogroup(tmp_path):
    """A process in no session of its own (started by an init or a service
    manager that never calls setsid, as on some CI runners) reads an empty
    autogroup: the host's default one. It is a group like any other, so rule 0
    still finds the job's processes there; sessions and cgroups stay apart."""
    def key(cgroup, autogroup):  # the key of a process whose two files read these texts
        (tmp_path / "cgroup").write_text(cgroup)
        (tmp_path / "autogroup").write_text(autogroup)
        return hooks().group_key_of(str(tmp_path / "cgroup"), str(tmp_path / "autogroup"))

    cgroup, session = "0::/\n", "/autogroup-7 nice 0\n"
    assert key(cgroup, "") != 0 and key(cgroup, "") == key(cgroup, "")
    assert key(cgroup, "") != key(cgroup, session)
    assert key(cgroup, session) != key(cgroup, "/autogroup-8 nice 0\n")
    assert key("0::/a\n", "") != key("0::/b\n", "")
    assert key("0::/a", "\n") != key("0::/a\n", "")  # the texts do not run into each other


@pytest.mark.parametrize("own_session", [False, True])
def test_group_holds_the_torchrpc_processes_of_this_session_only(own_session):
    """A torchrpc process started in this session is of this process's group
    (rule 0 counts its CPU as the job's); one in a session of its own (a
    separate terminal, a service) is not."""
    if not (os.path.exists("/proc/self/autogroup") and os.path.isdir("/dev/shm")):
        pytest.skip("needs /proc/self/autogroup and /dev/shm: without them a group is this process alone")
    hooks()  # built before the child needs it
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = "from tests.csrc import hooks; hooks().group_pids(); print('in', flush=True); import time; time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE,
                             start_new_session=own_session)
    try:
        assert child.stdout.readline().strip() == b"in"  # it has claimed its slot
        pids = hooks().group_pids()
        assert pids[0] == os.getpid()
        texts = {pid: [pathlib.Path(f"/proc/{pid}/{name}").read_text() for name in ("cgroup", "autogroup")]
                 for pid in (os.getpid(), child.pid)}
        assert (child.pid in pids) is not own_session, (pids, texts)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_a_slot_whose_pid_names_a_later_process_is_freed():
    """A torchrpc process killed without freeing its slot in the host's table
    leaves its pid there, and the pid may later name another process. The
    start time tells them apart: such a slot is not of the group (rule 0 would
    count that process's CPU as the job's), and it is freed, with any polls
    it had counted. The same slot with the process's real start time is."""
    if not (os.path.exists("/proc/self/autogroup") and os.path.isdir("/dev/shm")):
        pytest.skip("needs /proc and /dev/shm: without them there is no table")
    assert os.getpid() in hooks().group_pids()  # this process has claimed its slot
    path = f"/dev/shm/torchrpc-pollers-v3-{os.geteuid()}"
    slot_size, pid_at, pollers_at, group_at, started_at = 64, 0, 4, 8, 16
    other = subprocess.Popen(["sleep", "60"])  # in this session: of this process's group, by the key
    try:
        started = int(pathlib.Path(f"/proc/{other.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as table:
            slots = range(0, len(table), slot_size)
            mine = next(at for at in slots if struct.unpack_from("i", table, at + pid_at)[0] == os.getpid())
            group = struct.unpack_from("Q", table, mine + group_at)[0]
            free = next(at for at in slots if struct.unpack_from("i", table, at + pid_at)[0] == 0)

            def plant(start_time):  # the slot as its claimant leaves it, the pid last
                struct.pack_into("i", table, free + pollers_at, 3)
                struct.pack_into("Q", table, free + group_at, group)
                struct.pack_into("Q", table, free + started_at, start_time)
                struct.pack_into("i", table, free + pid_at, other.pid)

            try:
                plant(started)
                assert other.pid in hooks().group_pids()  # the claimant itself still runs
                plant(started - 1)  # an earlier process of that pid
                assert other.pid not in hooks().group_pids()
                assert struct.unpack_from("i", table, free + pid_at)[0] == 0, "the dead claimant's slot was kept"
            finally:
                struct.pack_into("i", table, free + pid_at, 0)
    finally:
        other.kill()
        other.wait()
