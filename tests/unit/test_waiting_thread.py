"""A thread that waits for a future and meanwhile runs the tasks other
threads offer it (csrc/common/waiting_thread.h): distributed autograd's
root and the TORCHRPC backend's rpc_sync wait this way. One task at a
time: an offer made while it has one is refused, so the offerer runs the
task elsewhere (the pool) and tasks that can run in parallel still do."""

import threading

import torch

from tests.csrc import hooks

TIMEOUT = 10


def _offer_until_taken(waiter, fn):
    # Right after a task returns, the thread takes a moment to accept again.
    for _ in range(1000):
        if waiter.offer(fn):
            return True
        threading.Event().wait(0.001)
    return False


def test_tasks_run_on_the_waiting_thread_one_at_a_time():
    waiter = hooks().WaitingThread()
    future = torch.futures.Future()
    ran = []  # (task, thread ident)
    first_started, release_first = threading.Event(), threading.Event()
    offers = {}

    def first():
        ran.append(("first", threading.get_ident()))
        first_started.set()
        assert release_first.wait(TIMEOUT)

    def third():
        ran.append(("third", threading.get_ident()))
        future.set_result(None)

    def other_thread():
        try:
            if first_started.wait(TIMEOUT):
                offers["while busy"] = waiter.offer(lambda: ran.append(("second", threading.get_ident())))
            release_first.set()
            offers["after"] = _offer_until_taken(waiter, third)
        finally:
            if not offers.get("after"):  # end the wait anyway: the asserts below tell what failed
                release_first.set()
                future.set_result(None)

    # Offered before the wait begins: taken, and run once it does.
    assert waiter.offer(first)
    assert not waiter.offer(lambda: None), "a second task was taken while one waited"
    helper = threading.Thread(target=other_thread)
    helper.start()
    waiter.serve_until(future)
    helper.join(TIMEOUT)

    me = threading.get_ident()
    assert offers == {"while busy": False, "after": True}
    assert ran == [("first", me), ("third", me)]
    assert not waiter.offer(lambda: None), "a task was taken after the wait ended"


def test_a_task_taken_but_not_run_goes_elsewhere_when_the_thread_stops_waiting():
    waiter = hooks().WaitingThread()
    ran = threading.Event()
    where = []
    assert waiter.offer(lambda: (where.append(threading.get_ident()), ran.set()))
    waiter.close()  # the thread's own work failed: it will not serve
    assert ran.wait(TIMEOUT), "the task taken before close() never ran"
    assert where != [threading.get_ident()]
    assert not waiter.offer(lambda: None)


def test_a_wait_on_a_completed_future_returns_at_once():
    waiter = hooks().WaitingThread()
    future = torch.futures.Future()
    future.set_result(1)
    waiter.serve_until(future)
    assert not waiter.offer(lambda: None)
