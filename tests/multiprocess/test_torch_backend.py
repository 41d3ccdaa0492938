"""torch.distributed.rpc's TORCHRPC backend: a plain upstream program
(``torch.distributed.rpc``, ``torch.distributed.autograd``), with
``backend=rpc.BackendType.TORCHRPC``, on three workers. Upstream's API,
RRefs, TorchScript and distributed autograd run above torchrpc's agent
(csrc/torch_backend/). The job ends with a graceful shutdown that must wait
for a call still in flight."""

import os
import signal
import struct
import threading
import time

import pytest
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch.testing import assert_close

from tests.multiprocess import funcs
from tests.multiprocess import inline_calls_funcs as I
from tests.multiprocess import layout_funcs as L
from tests.multiprocess import probes
from tests.multiprocess import torch_backend_funcs as F
from tests.multiprocess.torch_backend_job import TorchBackendJob


@pytest.fixture(scope="module", autouse=True)
def job():
    with TorchBackendJob(3) as j:
        yield j
        # Graceful: shutdown waits for this call (join: no call in flight anywhere).
        late = rpc.rpc_async("worker1", F.sleep_then, args=(0.5, 7))
        rpc.shutdown()
        assert late.done() and late.wait() == 7
        assert j.wait_exits() == {1: 0, 2: 0}, (j.log(1), j.log(2))


def test_the_backend_is_registered_and_its_agent_is_upstreams_kind():
    agent = rpc.api._get_current_rpc_agent()
    assert isinstance(agent, torch._C._distributed_rpc.RpcAgent)
    assert rpc.BackendType.TORCHRPC.name == "TORCHRPC"
    assert sorted(w.name for w in agent.get_worker_infos()) == ["worker0", "worker1", "worker2"]
    assert rpc.get_worker_info("worker2").id == 2
    assert agent.get_debug_info()["agent.backend"] == "TORCHRPC"
    assert agent.get_metrics()["agent.thread_pool_size"] == "4"


def test_rpc_sync_of_a_builtin():
    assert_close(rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2, 3), 1)), torch.full((2, 3), 2.0))


def test_a_type_tag_nested_past_the_cap_is_refused_with_a_clear_error():
    # torch's type parsers recurse once per level of a container's type tag
    # (a 30 KB tag of 5,000 levels crashed a worker): the callee refuses one
    # nested past the cap before parsing it, in upstream's callback too.
    assert rpc.rpc_sync("worker1", F.len_at_the_cap, args=(F.nested(100),)) == 1
    for _ in range(2):  # the callback, then a known callee's call decoded where it was read
        with pytest.raises(Exception, match="a type tag nested 101 levels deep, over the cap of 100"):
            rpc.rpc_sync("worker1", F.len_past_the_cap, args=(F.nested(101),))
    assert rpc.rpc_sync("worker1", F.len_at_the_cap, args=(F.nested(100),)) == 1


def test_a_python_pickle_that_would_grow_the_memo_is_refused_plain_or_wrapped():
    # Python's unpickler would grow its memo to the index the pickle's first
    # put declares (1.6 GB and seconds under the GIL) before it read on;
    # upstream's callback unpickles what it is sent, so the backend checks
    # it first, inside distributed autograd's and the profiler's wrappers too
    # (a remote()'s refused creation leaves upstream's caller waiting, as
    # with TensorPipe: tests/unit/test_upstream_payloads.py checks those).
    from torch._C._distributed_rpc import _invoke_rpc_python_udf
    from torch.autograd.profiler_legacy import profile
    from torch.distributed.rpc.api import _enable_rpc_profiler
    from torch.distributed.rpc.internal import RPCExecMode

    worker1 = rpc.get_worker_info("worker1")
    pid = rpc.rpc_sync(worker1, funcs.pid)
    rss = probes.rss_bytes(pid)
    bomb = b"\x80\x05N" + b"r" + struct.pack("<I", 101_317_043) + b"."
    refused = "upstream's PYTHON_CALL .*pickle memo index 101317043 skips ahead"
    with pytest.raises(RuntimeError, match=refused):
        _invoke_rpc_python_udf(worker1, bomb, [], 10.0, False).wait()
    with dist_autograd.context():
        with pytest.raises(RuntimeError, match="FORWARD_AUTOGRAD_REQ wraps a message that holds Python's pickle memo"):
            _invoke_rpc_python_udf(worker1, bomb, [torch.ones(2, requires_grad=True)], 10.0, False).wait()
        with profile(), pytest.raises(RuntimeError, match="RUN_WITH_PROFILING_REQ wraps a message that wraps"):
            with _enable_rpc_profiler(True, "bomb", None, RPCExecMode.ASYNC, worker1):  # as rpc_async does
                fut = _invoke_rpc_python_udf(worker1, bomb, [], 10.0, False)
            fut.wait()
    assert probes.rss_bytes(pid) - rss < 200 << 20
    assert rpc.rpc_sync(worker1, F.add, args=(1, 2)) == 3


def test_rpc_async_of_a_python_function_many_in_flight():
    futures = [rpc.rpc_async(f"worker{1 + i % 2}", F.add, args=(torch.tensor([i]), i)) for i in range(64)]
    assert [int(f.wait()) for f in futures] == [2 * i for i in range(64)]


def test_rpc_sync_completes_on_the_thread_that_waits_for_it():
    # The caller's thread runs the call's completion (here: unpickling its
    # result) when the response comes, instead of sleeping until a pool
    # thread has done it and wakes it.
    assert rpc.rpc_sync("worker1", F.unpickled_on) == threading.get_ident()
    box = []
    t = threading.Thread(target=lambda: box.append((rpc.rpc_sync("worker2", F.unpickled_on), threading.get_ident())))
    t.start()
    t.join(timeout=30)
    assert box and box[0][0] == box[0][1]


def test_ctrl_c_ends_an_rpc_sync_and_the_call_still_completes():
    agent = rpc.api._get_current_rpc_agent()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        started = time.monotonic()
        threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            rpc.rpc_sync("worker1", F.sleep_then, args=(3.0, 1))
        assert time.monotonic() - started < 2
    finally:
        signal.signal(signal.SIGINT, previous)
    # Its response is still taken (on the pool): nothing stays pending.
    deadline = time.monotonic() + 10
    while agent._pending_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert agent._pending_requests() == 0


def test_a_large_tensor_both_ways():
    t = torch.randn(1 << 20)
    assert_close(rpc.rpc_sync("worker1", F.add, args=(t, t)), 2 * t)


def test_a_script_function_and_torchscripts_own_rpc_async():
    a, b = torch.ones(3), torch.arange(3.0)
    assert_close(rpc.rpc_sync("worker1", F.script_add, args=(a, b)), a + b)
    # script_caller runs on worker1 and calls worker2 from TorchScript.
    assert_close(rpc.rpc_sync("worker1", F.script_caller, args=("worker2", a, b)), a + b)


def test_a_call_made_inside_a_call():
    assert_close(rpc.rpc_sync("worker1", F.nested_add, args=("worker2", torch.ones(2), 2)), torch.full((2,), 4.0))


def test_python_requests_take_turns_on_the_callee():
    # Upstream's callback takes the GIL several times a request; requests
    # run side by side would pass it back and forth. The callee runs them
    # one after the other, even short ones.
    overlaps = funcs.overlapping_pairs(rpc.rpc_async, "worker2", 0.002)
    # A machine that stalls a request for over 5 ms (the other's patience) may make one pair overlap.
    assert overlaps <= 1, f"{overlaps} of 6 pairs of Python requests ran side by side"


def test_a_waiting_python_request_does_not_hold_up_others():
    sleeper = rpc.rpc_async("worker2", F.sleep_then, args=(2.0, 9))
    time.sleep(0.2)
    start = time.perf_counter()
    assert int(rpc.rpc_sync("worker2", F.add, args=(torch.ones(1), 1), timeout=10)) == 2
    waited = time.perf_counter() - start
    assert waited < 1.0, f"a Python request waited {waited:.2f} s for a sleeping one"
    # A request that waits for a nested call back into its own worker completes: a lock held
    # across the wait would deadlock here (the request gives its turn up as it sends).
    assert_close(rpc.rpc_sync("worker2", F.nested_add, args=("worker2", torch.ones(2), 2), timeout=10),
                 torch.full((2,), 4.0))
    assert sleeper.wait() == 9


def test_remote_and_to_here_with_a_fork_on_a_third_worker():
    rref = rpc.remote("worker1", torch.add, args=(torch.ones(2), 1))
    assert_close(rref.to_here(), torch.full((2,), 2.0))
    python_rref = rpc.remote("worker2", F.add, args=(torch.ones(2), 2))
    assert_close(python_rref.to_here(), torch.full((2,), 3.0))
    # worker2 gets a fork of worker1's RRef and fetches from the owner.
    assert_close(rpc.rpc_sync("worker2", F.rref_value_plus, args=(rref, 10)), torch.full((2,), 12.0))


def test_an_error_raised_remotely_comes_back_as_its_type():
    with pytest.raises(ValueError, match="bad value 42"):
        rpc.rpc_sync("worker2", F.raise_value_error, args=("bad value 42",))
    fut = rpc.rpc_async("worker1", torch.add, args=(torch.ones(2), torch.ones(3)))
    with pytest.raises(RuntimeError, match="size of tensor a"):
        fut.wait()


def test_a_timeout_says_upstreams_phrase_and_names_the_worker():
    fut = rpc.rpc_async("worker1", F.sleep_then, args=(2.0, 0), timeout=0.2)
    with pytest.raises(RuntimeError, match=r"worker1.*RPC ran for more than set timeout \(200 ms\)") as err:
        fut.wait()
    # It names where the default is set: the options this job passed (torchrpc's own are RpcOptions).
    assert "TorchRpcBackendOptions.rpc_timeout" in str(err.value)
    assert "RpcOptions.rpc_timeout" not in str(err.value).replace("TorchRpcBackendOptions", "")
    # worker1 is still fine, and a timeout of 0 means none
    assert rpc.rpc_sync("worker1", F.sleep_then, args=(0.01, 5), timeout=0) == 5


def test_a_tensor_on_another_device_is_refused_and_the_callee_stays_up():
    # As TensorPipe without a device map: an error that says to move it to
    # the CPU, never a read of its bytes (a CUDA tensor's, here the meta device's).
    m = torch.empty(3, device="meta")
    for fn, args in ((F.add, (m, m)), (torch.add, (m, 1)), (F.script_add, (m, m))):
        with pytest.raises(RuntimeError, match=r"worker0 -> worker1 .*CPU tensors only; tensor #0 is on meta\. Move it "):
            rpc.rpc_sync("worker1", fn, args=args)
    with pytest.raises(RuntimeError, match=r"worker0 -> worker1 .*: its result cannot be sent back: .*CPU tensors only"
                                           r".*raised on worker1"):
        rpc.rpc_sync("worker1", L.on_meta, args=((2,),))
    with pytest.raises(RuntimeError, match="CPU tensors only; tensor #0 is on meta"):
        rpc.remote("worker1", L.on_meta, args=((2,),)).to_here()
    assert_close(rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1)), torch.full((2,), 2.0))


def test_tensors_that_share_memory_arrive_sharing_it():
    x = torch.arange(6.0)
    changed = torch.tensor([0.0, 1, 102, 103, 4, 5])
    assert_close(rpc.rpc_sync("worker1", L.bump_second, args=(x, x[2:4])), changed)


def test_a_call_to_self_works_on_copies():
    # As TensorPipe's, which sends it through a pipe to itself.
    for fn in (F.add_one_in_place, F.script_add_one_in_place):
        x = torch.zeros(3)
        out = rpc.rpc_sync("worker0", fn, args=(x,))
        assert_close(x, torch.zeros(3))
        assert_close(out, torch.ones(3))
        assert out.data_ptr() != x.data_ptr()


def test_requires_grad_flags_changed_in_a_call_to_self_stay_on_that_side():
    # Tensors that arrive carry the sender's flag (as TensorPipe's pickled
    # ones), but the receiver's changes to them reach neither side's own.
    x = torch.ones(3, requires_grad=True)
    kept, arg_flag = rpc.rpc_sync("worker0", F.stop_grad_and_return_kept, args=(x,))
    assert arg_flag is False and x.requires_grad
    assert kept.requires_grad
    kept.requires_grad_(False)
    assert rpc.rpc_sync("worker0", F.kept_requires_grad)


def test_distributed_autograd_backward():
    t1 = torch.rand(3, 3, requires_grad=True)
    t2 = torch.rand(3, 3, requires_grad=True)
    with dist_autograd.context() as ctx:
        loss = rpc.rpc_sync("worker1", torch.add, args=(t1, t2))
        loss = rpc.rpc_sync("worker2", F.add, args=(loss, t1)).sum()
        dist_autograd.backward(ctx, [loss])
        grads = dist_autograd.get_gradients(ctx)
    assert_close(grads[t1], torch.full((3, 3), 2.0))
    assert_close(grads[t2], torch.ones(3, 3))


def test_each_profiled_call_brings_back_the_callees_ops_once():
    # Upstream's profiled request leaves its profiler on the callee's thread
    # when the call completes at once. The pool reuses that thread, so each
    # later call recorded every op once more, and the caller's profile then
    # lost the callee's events altogether.
    from torch.autograd.profiler_legacy import profile

    for _ in range(3):
        with profile() as prof:
            rpc.rpc_sync("worker2", F.add, args=(torch.ones(2), 1))
        remote = [e.name for e in prof.function_events if e.node_id == 2]
        assert sum(name.endswith("#remote_op: aten::add") for name in remote) == 1, remote


def test_pool_threads_keep_their_python_thread_state():
    # Upstream's callbacks take the GIL on the agent's pool threads. A thread
    # without a Python state makes one per acquire and frees it after (with
    # munmap: 100-300 us a call on this VM); the backend's threads keep theirs.
    for _ in range(20):
        rpc.rpc_sync("worker1", F.add, args=(torch.ones(1), 1))
    kept = rpc.rpc_sync("worker1", F.kept_thread_states)
    assert 1 <= kept <= 4, f"worker1 keeps {kept} Python thread states (its pool has 4 threads)"
    from torchrpc import _C

    rpc.rpc_async("worker1", F.add, args=(torch.ones(1), 1)).wait()
    assert _C.debug_counters()["kept_thread_states"] >= 1  # the caller's, which ran rpc_async's callbacks


_probe = I.Probe(rpc.rpc_sync)
_inline_on, _calls, _prove = _probe.inline_on, _probe.calls, _probe.prove


def test_short_script_and_builtin_calls_run_where_they_were_read_once_proven():
    # torch_backend/inline_script_calls.h: the rule of torchrpc's own agent, on upstream's SCRIPT_CALL.
    x = torch.arange(4.0)
    for fn, args, expected in [(F.script_add, (x, x), 2 * x), (torch.add, (x, 2), x + 2)]:
        _prove(fn, args)
        results, inlined = _calls(fn, args, 30)
        assert all(torch.equal(r, expected) for r in results)
        assert inlined >= 20, f"{inlined} of 30 calls of a proven short {fn} ran where they were read"


def test_a_loop_a_number_argument_or_large_inputs_keep_a_call_on_the_pool():
    results, inlined = _calls(I.add_in_a_loop, (torch.zeros(2), 3), 20)
    assert all(torch.equal(r, torch.full((2,), 3.0)) for r in results) and inlined == 0
    results, inlined = _calls(torch.ones, ((3,),), 20)
    assert all(torch.equal(r, torch.ones(3)) for r in results) and inlined == 0
    _prove(F.script_add, (torch.zeros(2), torch.zeros(2)))
    big = torch.ones(1 << 18)  # 1 MB
    results, inlined = _calls(F.script_add, (big, big), 3)
    assert all(torch.equal(r, 2 * big) for r in results) and inlined == 0


def test_a_script_call_that_ran_long_goes_back_to_the_pool_for_a_while():
    small, large = torch.ones(2), torch.ones(4096)  # large: 16 KB, under the cap on inputs
    _prove(I.outer_sum, (small,))
    assert rpc.rpc_sync("worker1", I.outer_sum, args=(large,)).item() == 4096 * 4096  # one long run
    results, inlined = _calls(I.outer_sum, (small,), 5)
    assert all(r.item() == 4 for r in results)
    assert inlined == 0, "a function that just ran long ran where it was read again at once"
    _prove(I.outer_sum, (small,))  # it comes back


# Over 64 KB of tensors: no candidate, so upstream's callback runs the call
# (the reference for what torchrpc's own runs must answer).
_UPSTREAMS = 1 << 15


def test_an_error_raised_where_it_was_read_is_upstreams_as_on_the_pool():
    def raised(n=2):
        with pytest.raises(Exception) as info:
            rpc.rpc_sync("worker2", I.checked, args=(torch.full((n,), 100.0),))
        return info.value

    on_the_pool = raised(_UPSTREAMS)  # upstream's callback
    _prove(I.checked, (torch.ones(2),), worker="worker2")
    before = _inline_on("worker2")
    inline = raised()
    assert _inline_on("worker2") == before + 1
    assert type(inline) is type(on_the_pool) and str(inline) == str(on_the_pool)
    assert "too big" in str(inline)


def test_a_known_function_that_the_pool_runs_answers_as_upstreams_callback():
    # A known callee runs from the arguments the reading thread decoded;
    # one that is not bounded runs so on the pool.
    x = torch.ones(2)

    def raised(n=2):
        with pytest.raises(Exception) as info:
            rpc.rpc_sync("worker1", I.checked_in_a_loop, args=(torch.full((n,), 100.0), 2))
        return info.value

    first, later = raised(_UPSTREAMS), (raised(), raised())[1]  # upstream's callback, then torchrpc's run
    assert type(first) is type(later) and str(first) == str(later) and "too big" in str(later)
    results, inlined = _calls(I.checked_in_a_loop, (x, 3), 5)
    assert all(torch.equal(r, x + 3) for r in results) and inlined == 0


def test_a_builtin_that_fails_where_it_was_read_fails_as_upstreams():
    # torchrpc runs a known builtin itself and answers its failure as upstream's callback would.
    def raised(width=1):
        with pytest.raises(Exception) as info:
            rpc.rpc_sync("worker2", torch.mul, args=(torch.ones(2, width), torch.ones(3, width)))
        return info.value

    on_the_pool = raised(_UPSTREAMS // 4)  # upstream's callback (the sizes in its text are the same)
    _prove(torch.mul, (torch.ones(2, 1), torch.ones(2, 1)), worker="worker2")
    inline = raised()
    # Upstream's text ends with the C++ stack of the thread that ran it: the same up to there.
    first_line = str(inline).splitlines()[0]
    assert type(inline) is type(on_the_pool) and first_line == str(on_the_pool).splitlines()[0]
    assert "must match the size" in first_line


def test_a_server_side_profile_records_a_builtin_that_would_run_where_it_was_read():
    # torchrpc runs a proven builtin without upstream's callback, which is
    # where a server-side profile records it: a profile sends it back there.
    x, y = torch.tensor(1), torch.tensor(2)
    _prove(torch.sub, (x, y), worker="worker2")
    profile = rpc.remote("worker2", rpc._server_process_global_profile)
    profile.rpc_sync().__enter__()
    assert rpc.rpc_sync("worker2", torch.sub, args=(x, y)) == -1
    profile.rpc_sync().__exit__(None, None, None)
    assert "aten::sub" in rpc.rpc_sync("worker2", F.profiled_events, args=(profile,))
    _, inlined = _calls(torch.sub, (x, y), 10, worker="worker2")
    assert inlined >= 5, "a builtin ran where it was read no more after a profile ended"
