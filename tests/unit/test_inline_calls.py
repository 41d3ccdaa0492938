"""How a callee proves its runs short (csrc/script_dispatch/inline_calls.h
RunRecord, RunTimer): by the CPU its runs take, not by how long their thread
was kept off its core. In separate sessions the scheduler preempts pool
threads often; timed by the wall clock, a short function never proved short
there (the TORCHRPC backend's 128 calls in flight all stayed on the pool)."""

from tests.csrc import hooks


def test_short_runs_prove_a_callee_short():
    assert hooks().proven_after_runs(5, 1, 0)


def test_runs_that_take_cpu_do_not():
    assert not hooks().proven_after_runs(5, 300, 0), "runs of 300 µs of work proved short"


def test_time_off_the_core_does_not_count_against_a_run():
    # 1 µs of work, then 2 ms asleep: a wall clock reads 2 ms, over the 100 µs of a short run.
    assert hooks().proven_after_runs(5, 1, 2000)


def test_the_cpu_clock_is_read_only_after_a_run_the_wall_clock_found_long():
    # It costs a system call at each end of a run; idle past its window, a
    # run reads the wall clock alone, and one that was not short arms it.
    first, after_a_long_run = hooks().cpu_clock_read(1100)
    assert (first, after_a_long_run) == (False, True)
