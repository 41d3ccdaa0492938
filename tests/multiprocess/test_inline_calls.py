"""Short TorchScript and builtin calls run on the thread that read them
(csrc/script_dispatch/inline_calls.h): once a function or operator has
proven short, with small inputs, no loop, nothing that waits and no number
that sizes its output. Everything else, and a
function that ran long, goes to the pool; what the caller sees is the same
either way."""

import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import inline_calls_funcs as F
from tests.multiprocess.cluster import Cluster


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3, worker_env={2: {"TORCHRPC_INLINE_CALLS": "0"}}) as c:
        yield c


_probe = F.Probe(rpc.rpc_sync)
inline_on, calls, prove = _probe.inline_on, _probe.calls, _probe.prove


def test_a_short_function_runs_where_it_was_read_once_proven():
    x = torch.arange(4.0)
    _, inlined = calls(F.add_one, (x,), 1)
    assert inlined == 0, "the first run of a function ran where it was read"
    prove(F.add_one, (x,))
    results, inlined = calls(F.add_one, (x,), 30)
    assert all(torch.equal(r, x + 1) for r in results)
    assert inlined >= 20, f"{inlined} of 30 calls of a proven short function ran where they were read"


def test_a_function_with_a_loop_a_number_argument_or_large_inputs_stays_on_the_pool():
    results, inlined = calls(F.add_in_a_loop, (torch.zeros(2), 3), 20)
    assert all(torch.equal(r, torch.full((2,), 3.0)) for r in results)
    assert inlined == 0, "a function with a loop ran where it was read"
    results, inlined = calls(F.ones_of_size, (2,), 20)
    assert all(torch.equal(r, torch.ones(2)) for r in results)
    assert inlined == 0, "a function that a number argument sizes ran where it was read"
    prove(F.add_one, (torch.zeros(2),))
    big = torch.zeros(1 << 18)  # 1 MB
    results, inlined = calls(F.add_one, (big,), 5)
    assert all(torch.equal(r, big + 1) for r in results)
    assert inlined == 0, "a call with 1 MB of tensors ran where it was read"


def test_a_function_that_ran_long_goes_back_to_the_pool_for_a_while():
    small, large = torch.ones(2), torch.ones(4096)  # large: 16 KB, under the cap on inputs
    prove(F.outer_sum, (small,))
    long = rpc.rpc_sync("worker1", F.outer_sum, args=(large,))  # milliseconds: one long run
    assert long.item() == 4096 * 4096
    # After one long run it needs twice the short runs in a row (6) again.
    results, inlined = calls(F.outer_sum, (small,), 5)
    assert all(r.item() == 4 for r in results)
    assert inlined == 0, "a function that just ran long ran where it was read again at once"
    prove(F.outer_sum, (small,))  # it comes back


def test_a_builtin_runs_where_it_was_read_once_proven():
    x = torch.arange(4.0)
    prove(torch.add, (x, 2))
    results, inlined = calls(torch.add, (x, 2), 30)
    assert all(torch.equal(r, x + 2) for r in results)
    assert inlined >= 20, f"{inlined} of 30 calls of a proven short builtin ran where they were read"
    results, inlined = calls(torch.add, (x, 2), 10, worker="worker2")
    assert all(torch.equal(r, x + 2) for r in results) and inlined == 0


def test_a_builtin_that_a_number_or_tensor_values_size_stays_on_the_pool():
    results, inlined = calls(torch.ones, ((3,),), 20)
    assert all(torch.equal(r, torch.ones(3)) for r in results)
    assert inlined == 0, "torch.ones(n) ran where it was read"
    x = torch.tensor([0, 2])
    results, inlined = calls(torch.bincount, (x,), 20)
    assert all(torch.equal(r, torch.bincount(x)) for r in results)
    assert inlined == 0, "torch.bincount ran where it was read"


def raised(worker, x):
    with pytest.raises(Exception) as info:
        rpc.rpc_sync(worker, F.checked, args=(x,))
    return info.value


def test_an_error_raised_where_it_was_read_reaches_the_caller_as_usual():
    big = torch.full((2,), 100.0)
    on_the_pool = raised("worker2", big)  # worker2 runs no call where it read it
    prove(F.checked, (torch.ones(2),))
    before = inline_on("worker1")
    inline = raised("worker1", big)
    assert inline_on("worker1") == before + 1
    assert type(inline) is type(on_the_pool)
    assert str(inline).replace("worker1", "worker2") == str(on_the_pool)
    assert "too big" in str(inline)
    assert torch.equal(rpc.rpc_sync("worker1", F.checked, args=(torch.ones(2),)), torch.full((2,), 2.0))


def test_torchrpc_inline_calls_0_turns_it_off():
    results, inlined = calls(F.add_one, (torch.zeros(2),), 20, worker="worker2")
    assert all(torch.equal(r, torch.ones(2)) for r in results)
    assert inlined == 0
