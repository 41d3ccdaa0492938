"""torchrpc.nn.RemoteModule on a 3-worker job: forward runs on the owner,
backward in a distributed autograd context reaches its parameters and a
DistributedOptimizer steps them; a RemoteModule sent to another worker
drives the same module; what upstream refuses is refused here."""

import pickle

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import torchrpc as rpc
from tests.multiprocess import remote_module_funcs as F
from tests.multiprocess.cluster import Cluster


@pytest.fixture(scope="module", autouse=True)
def job():
    with Cluster(3) as c:
        yield c


def x_input():
    return torch.arange(6, dtype=torch.float64).reshape(2, 3)


def test_forward_runs_on_the_owner():
    rm = rpc.nn.RemoteModule("worker1/cpu", F.Affine, args=(3,), kwargs={"bias_value": 1.0})
    assert rm.on == "worker1" and rm.device == "cpu"
    assert rm.get_module_rref().owner_name() == "worker1"
    assert_close(rm.forward(x_input()), x_input() + 1.0)
    assert_close(rm(x_input(), scale=2.0), x_input() + 2.0)  # nn.Module.__call__ and keyword arguments
    assert_close(rm.forward_async(x_input(), scale=3.0).wait(), x_input() + 3.0)


def test_rank_form_of_the_remote_device():
    rm = rpc.nn.RemoteModule("rank:2/cpu", F.Affine, args=(3,))
    assert rm.get_module_rref().owner_name() == "worker2"
    assert_close(rm(x_input()), x_input())


def test_training_with_distributed_autograd_and_optimizer():
    rm = rpc.nn.RemoteModule("worker1/cpu", F.Affine, args=(3,))
    params = rm.remote_parameters()
    assert [p.owner_name() for p in params] == ["worker1", "worker1"]
    opt = rpc.optim.DistributedOptimizer(torch.optim.SGD, params, lr=0.1)
    ref = F.Affine(3)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(2):
        with rpc.autograd.context() as ctx:
            loss = (rm(x_input()) ** 2).sum()
            rpc.autograd.backward(ctx, [loss])
            opt.step(ctx)
        ref_opt.zero_grad()
        (ref(x_input()) ** 2).sum().backward()
        ref_opt.step()
    assert_close(rpc.rpc_sync("worker1", F.weight_of, args=(rm.get_module_rref(),)), ref.weight.detach())


def test_train_and_eval_set_the_remote_mode():
    rm = rpc.nn.RemoteModule("worker1/cpu", F.Affine, args=(3,))
    assert rm.eval() is rm
    assert rpc.rpc_sync("worker1", F.training_of, args=(rm.get_module_rref(),)) is False
    rm.train()
    assert rpc.rpc_sync("worker1", F.training_of, args=(rm.get_module_rref(),)) is True


def test_sent_to_another_worker_it_drives_the_same_module():
    rm = rpc.nn.RemoteModule("worker1/cpu", F.Affine, args=(3,), kwargs={"bias_value": 2.0})
    assert_close(rpc.rpc_sync("worker2", F.forward_there, args=(rm, x_input())), x_input() + 2.0)
    # to its owner, where the module is local
    assert_close(rpc.rpc_sync("worker1", F.module_of, args=(rm,)), torch.eye(3, dtype=torch.float64))
    assert rpc.rpc_sync("worker2", F.attributes_of, args=(rm,)) == sorted(
        ["on", "device", "is_device_map_set", "is_scriptable", "generated_methods", "module_rref", "forward",
         "forward_async", "training", "_parameters", "_buffers", "_non_persistent_buffers_set",
         "_backward_pre_hooks", "_backward_hooks", "_is_full_backward_hook", "_forward_hooks",
         "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
         "_forward_pre_hooks_with_kwargs", "_state_dict_hooks", "_state_dict_pre_hooks",
         "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", "_modules"])


def test_a_new_attribute_does_not_travel():
    rm = rpc.nn.RemoteModule("worker1/cpu", F.Affine, args=(3,))
    rm.extra = 1
    with pytest.warns(RuntimeWarning, match="extra"):
        names = rpc.rpc_sync("worker2", F.attributes_of, args=(rm,))
    assert "extra" not in names


def test_init_from_module_rref_shares_the_module():
    rm = rpc.nn.RemoteModule("worker1/cpu", F.Affine, args=(3,))
    other = rpc.nn.RemoteModule.init_from_module_rref("worker1/cpu", rm.get_module_rref())
    assert other.get_module_rref() is rm.get_module_rref()
    assert_close(other(x_input()), rm(x_input()))


def test_plain_pickle_is_refused():
    rm = rpc.nn.RemoteModule("worker1/cpu", F.Affine, args=(3,))
    with pytest.raises(RuntimeError, match="Cannot pickle RemoteModule in python pickler"):
        pickle.dumps(rm)


@pytest.mark.parametrize("method, args", [
    ("to", ("cpu",)), ("cpu", ()), ("state_dict", ()), ("register_buffer", ("b", None)),
    ("register_forward_hook", (print,)), ("zero_grad", ()), ("named_parameters", ()), ("modules", ()),
])
def test_local_shell_methods_raise(method, args):
    rm = rpc.nn.RemoteModule("worker1/cpu", F.Affine, args=(3,))
    with pytest.raises(ValueError, match=f"Method ``{method}`` not supported for RemoteModule"):
        getattr(rm, method)(*args)
    with pytest.raises(ValueError, match="Please use ``remote_parameters`` instead"):
        rm.parameters()


def test_bad_module_class_fails_on_first_use():
    rm = rpc.nn.RemoteModule("worker1/cpu", F.NotAModule, args=(3,))
    with pytest.raises(ValueError, match="returns an instance of <class nn.Module>"):
        rm(x_input())


def test_bad_remote_device():
    with pytest.raises(ValueError, match="unknown worker 'nobody'"):
        rpc.nn.RemoteModule("nobody/cpu", F.Affine, args=(3,))
    with pytest.raises(TypeError, match="expects a str"):
        rpc.nn.RemoteModule(1, F.Affine, args=(3,))


def test_torchs_remote_module_is_refused_with_the_fix():
    from torch.distributed.nn import RemoteModule as TorchRemoteModule

    with pytest.raises(TypeError, match="use torchrpc.nn.RemoteModule"):
        rpc.nn.RemoteModule("worker1/cpu", TorchRemoteModule, args=("worker1/cpu", nn.Linear, (3, 3)))
    with pytest.raises(TypeError, match="use torchrpc.nn.RemoteModule"):
        rpc.remote("worker1", TorchRemoteModule, args=("worker1/cpu", nn.Linear, (3, 3)))
