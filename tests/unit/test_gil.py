"""csrc/python_fallback/gil: torchrpc's threads keep one Python thread state
each while they live (a Python call no longer makes and deletes one, with an
munmap, every time it takes the GIL), and shutdown() deletes the states of
the threads it stopped. One worker, calling itself."""

import threading

import pytest

import torchrpc
from tests.multiprocess.cluster import free_port
from torchrpc._extension import native

_local = threading.local()


def calls_on_this_thread():
    """(OS thread id, how many calls this thread's threading.local has seen)."""
    _local.calls = getattr(_local, "calls", 0) + 1
    return threading.get_native_id(), _local.calls


def init_solo(threads):
    torchrpc.init_rpc("solo", rank=0, world_size=1,
                      rpc_backend_options=torchrpc.RpcOptions(init_method=f"tcp://127.0.0.1:{free_port()}",
                                                              num_worker_threads=threads))


@pytest.fixture
def solo():
    init_solo(2)
    yield
    torchrpc.shutdown()


def test_a_pool_thread_keeps_its_python_state_between_calls(solo):
    # threading.local lives in the thread state: with a fresh state per call,
    # every call would see a fresh local (a count of 1).
    served = {}
    for _ in range(30):
        tid, calls = torchrpc.rpc_sync("solo", calls_on_this_thread)
        served[tid] = served.get(tid, 0) + 1
        assert calls == served[tid], f"thread {tid} lost its threading.local after {served[tid] - 1} call(s)"
    assert max(served.values()) > 1


def test_shutdown_deletes_the_thread_states_of_its_threads():
    native().reap_thread_states()  # threads of earlier sessions in this process that exited since
    before = native().debug_counters()["kept_thread_states"]
    for _ in range(2):  # and a second session starts from the same count
        init_solo(4)
        futs = [torchrpc.rpc_async("solo", calls_on_this_thread) for _ in range(16)]
        assert len([f.wait() for f in futs]) == 16
        assert native().debug_counters()["kept_thread_states"] > before  # pool and callback threads hold theirs
        torchrpc.shutdown()
        after = native().debug_counters()["kept_thread_states"]
        assert after == before, f"{after - before} thread state(s) outlived shutdown"
