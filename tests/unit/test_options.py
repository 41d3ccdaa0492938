"""RpcOptions validation, errors mapping and WorkerInfo: single process."""

import datetime
import pickle

import pytest

import torchrpc
from torchrpc import errors


def test_defaults():
    o = torchrpc.RpcOptions()
    assert (o.num_worker_threads, o.rpc_timeout, o.init_method) == (16, 60.0, "env://")


def test_init_waits_as_long_as_torchs_rendezvous_for_workers_that_start_late():
    # upstream's init_rpc meets through dist.rendezvous, whose default timeout this is
    from torch.distributed.constants import default_pg_timeout

    assert torchrpc.RpcOptions().init_timeout == default_pg_timeout.total_seconds() == 1800


def test_timedelta_and_numbers_are_seconds():
    assert torchrpc.RpcOptions(rpc_timeout=datetime.timedelta(seconds=3)).rpc_timeout == 3.0
    assert torchrpc.RpcOptions(rpc_timeout=0).rpc_timeout == 0.0


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(num_worker_threads=0), ValueError, r"num_worker_threads=...\) must be at least 1; got 0"),
        (dict(num_worker_threads="4"), TypeError, "expects an int; got str"),
        (dict(num_worker_threads=True), TypeError, "expects an int; got bool"),
        (dict(rpc_timeout=-2), ValueError, r"rpc_timeout=...\) must be >= 0"),
        (dict(rpc_timeout="1"), TypeError, "rpc_timeout=...\\) expects seconds"),
        (dict(init_method="http://x"), ValueError, "expected 'env://'"),
        (dict(init_method=3), TypeError, "init_method=...\\) expects a str"),
        (dict(store="not a store"), TypeError, "torch.distributed.Store"),
        (dict(script_only=1), TypeError, r"script_only=...\) expects True or False; got int"),
        (dict(allow_import_by_name="no"), TypeError, r"allow_import_by_name=...\) expects True or False"),
        (dict(allow_shipped_code=None), TypeError, r"allow_shipped_code=...\) expects True or False"),
        (dict(allowed_callables="aten::add"), TypeError, r"allowed_callables=...\) expects a list of names"),
        (dict(allowed_callables=["aten::add", 3]), TypeError, r"expects names \(str\); got int 3"),
        (dict(allowed_callables=[""]), ValueError, r"allowed_callables=...\): '' is not a name"),
        (dict(allowed_callables=[" aten::add"]), ValueError, r"' aten::add' is not a name"),
    ],
)
def test_invalid_options_say_what_is_wrong(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        torchrpc.RpcOptions(**kwargs)


def test_callee_policy_defaults_allow_everything_and_reach_the_worker_as_a_tuple():
    assert torchrpc.RpcOptions().callee_policy() == (False, None, True, True)
    o = torchrpc.RpcOptions(script_only=True, allowed_callables=("b.f", "aten::add", "b.f"), allow_import_by_name=False,
                            allow_shipped_code=False)
    assert o.allowed_callables == frozenset({"aten::add", "b.f"})
    assert o.callee_policy() == (True, ["aten::add", "b.f"], False, False)
    assert "script_only=True" in repr(o)


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        torchrpc.RpcOptions(4)


def test_upstream_options_are_accepted():
    import torch.distributed.rpc as upstream

    o = torchrpc.RpcOptions.coerce(
        upstream.TensorPipeRpcBackendOptions(num_worker_threads=3, rpc_timeout=7, init_method="tcp://1.2.3.4:5")
    )
    assert (o.num_worker_threads, o.rpc_timeout, o.init_method) == (3, 7.0, "tcp://1.2.3.4:5")


def test_worker_info_compares_hashes_and_pickles():
    a, b = torchrpc.WorkerInfo("worker0", 0), torchrpc.WorkerInfo("worker1", 1)
    assert a == torchrpc.WorkerInfo("worker0", 0) and a != b and a < b
    assert len({a, b, torchrpc.WorkerInfo("worker0", 0)}) == 2
    assert pickle.loads(pickle.dumps(b)) == b
    assert repr(b) == "WorkerInfo(id=1, name=worker1)"


def test_remote_exceptions_keep_their_type_and_traceback():
    exc = errors.from_native((3, "bad (raised on worker1 while running 'f')", "KeyError", "Traceback...\n"))
    assert isinstance(exc, KeyError)
    assert "Remote traceback" in exc.__notes__[0]
    custom = errors.from_native((3, "boom", "no.such.module.Error", ""))
    assert isinstance(custom, errors.RemoteError) and custom.remote_type == "no.such.module.Error"


@pytest.mark.parametrize(
    "kind, cls", [(1, torchrpc.RpcTimeoutError), (2, torchrpc.PeerUnreachableError), (4, torchrpc.ShutdownError)]
)
def test_native_error_kinds_map_to_classes(kind, cls):
    exc = errors.from_native((kind, "msg", "", ""))
    assert type(exc) is cls and isinstance(exc, RuntimeError)


def test_calls_before_init_say_how_to_fix():
    with pytest.raises(torchrpc.NotInitializedError, match=r"call torchrpc.init_rpc\(name"):
        torchrpc.rpc_sync("worker1", len, args=([],))
    with pytest.raises(torchrpc.NotInitializedError):
        torchrpc.get_worker_info()
    with pytest.raises(torchrpc.NotInitializedError):
        torchrpc.get_rpc_timeout()


@pytest.mark.parametrize("name, why", [("", "must be non-empty"), ("has space", "Worker name must match"),
                                       ("a" * 128, "shorter than 128"), ("x/y", "Worker name must match")])
@pytest.mark.parametrize("where", ["init_rpc", "WorkerInfo"])
def test_invalid_worker_names_are_rejected_naming_them(name, why, where):
    # Both a ValueError (ours) and a RuntimeError (upstream's class), with upstream's phrase.
    for cls in (ValueError, RuntimeError):
        with pytest.raises(cls, match=f"{where}.*{why}"):
            if where == "init_rpc":
                torchrpc.init_rpc(name, rank=0, world_size=1)
            else:
                torchrpc.WorkerInfo(name, 0)


def test_worker_names_may_have_dots_and_colons_as_upstream():
    assert torchrpc.WorkerInfo("trainer:0.main", 3).name == "trainer:0.main"


def test_options_that_name_no_backend_need_one():
    class FooOptions(torchrpc.RpcBackendOptions):
        pass

    with pytest.raises(TypeError, match="Could not infer backend for options FooOptions"):
        torchrpc.init_rpc("worker0", rank=0, world_size=1, rpc_backend_options=FooOptions())
    with pytest.raises(TypeError, match="`rpc_backend_options` must be a `TensorPipeRpcBackendOptions`"):
        torchrpc.init_rpc("worker0", backend=torchrpc.BackendType.TENSORPIPE, rank=0, world_size=1,
                          rpc_backend_options=FooOptions())
    with pytest.raises(TypeError, match="Argument rpc_backend_options must be an instance of RpcBackendOptions"):
        torchrpc.init_rpc("worker0", rank=0, world_size=1, rpc_backend_options={"init_method": "env://"})


def test_torch_distributed_rpc_names_are_accepted():
    assert torchrpc.TensorPipeRpcBackendOptions is torchrpc.RpcOptions
    assert issubclass(torchrpc.RpcOptions, torchrpc.RpcBackendOptions)
    o = torchrpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=20, init_method="tcp://1.2.3.4:5",
                                             device_maps=None, devices=[], _transports=["uv"], _channels=["basic"])
    assert (o.num_worker_threads, o.rpc_timeout, o.device_maps, o.devices) == (8, 20.0, {}, [])
    o.set_device_map("worker1", {})
    o.set_devices([])
    assert torchrpc.BackendType.TENSORPIPE.name == "TENSORPIPE"
    assert torchrpc.is_available() and torchrpc.autograd.is_available()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: torchrpc.RpcOptions(device_maps={"worker1": {0: 1}}), r"RpcOptions\(device_maps="),
        (lambda: torchrpc.RpcOptions(devices=["cuda:0"]), r"RpcOptions\(devices=\['cuda:0'\]\)"),
        (lambda: torchrpc.RpcOptions().set_device_map("worker1", {0: 1}), r"set_device_map\('worker1', \{0: 1\}\)"),
        (lambda: torchrpc.RpcOptions().set_devices([0]), r"set_devices\(\[0\]\)"),
    ],
)
def test_cuda_device_maps_are_refused_saying_what_to_do(make, match):
    with pytest.raises(ValueError, match=match) as err:
        make()
    assert "CPU tensors only" in str(err.value) and "tensor.cpu()" in str(err.value)


def test_upstream_options_with_cuda_devices_are_refused():
    import torch.distributed.rpc as upstream

    with pytest.raises(ValueError, match="CPU tensors only"):
        torchrpc.RpcOptions.coerce(upstream.TensorPipeRpcBackendOptions(devices=["cuda:0"]))


@pytest.mark.parametrize("kwargs", [dict(device_maps=[0]), dict(devices="cuda:0"), dict(_transports="uv")])
def test_device_options_of_the_wrong_type_are_type_errors(kwargs):
    with pytest.raises(TypeError, match="expects a"):
        torchrpc.RpcOptions(**kwargs)


def test_unknown_backends_are_refused_before_joining():
    with pytest.raises(TypeError, match=r"init_rpc\(backend='gloo'\): Argument backend must be a member of BackendType; torchrpc has one backend"):
        torchrpc.init_rpc("worker0", backend="gloo", rank=0, world_size=1)
    assert not torchrpc.api._debug_info()["initialized"]
