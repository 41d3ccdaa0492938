"""The callee policy (RpcOptions script_only, allowed_callables,
allow_import_by_name, allow_shipped_code; csrc/script_dispatch/callee_policy.h).
worker1 is script-only and compiles no shipped code; worker2 runs only an
allowlist and resolves only registered names. This process (worker0) has no
policy and calls them as any member of the job could, also by hand
(raw_peer) with pickles that would create a file if they ever ran."""

import pickle

import numpy
import pytest
import torch

import torchrpc as rpc
from tests.multiprocess import funcs, raw_peer
from tests.multiprocess.cluster import Cluster

SECRET = b"test-callee-policy-job-secret"
SCRIPT_CALL, PYTHON_CALL, PYTHON_RET, EXCEPTION = 10, 12, 21, 29  # message/message_type.h
X = torch.ones(2)
ALLOWED = ["aten::add", "tests.add", "__torch__.tests.multiprocess.funcs.no_tensors",
           "tests.multiprocess.funcs.py_add", "torch.Tensor.add"]


@pytest.fixture(scope="module", autouse=True)
def job():
    options = {1: {"script_only": True, "allow_shipped_code": False},
               2: {"allowed_callables": ALLOWED, "allow_import_by_name": False}}
    with Cluster(3, secret=SECRET, worker_options=options) as c:
        yield c


@torch.jit.script
def ask(to: str, n: int) -> int:
    """Runs on worker1 (which imports this module by name): a call of `to` from TorchScript."""
    out = rpc.rpc_sync(to, "tests.no_tensors", args=(n,))
    assert isinstance(out, int)
    return out


def _tcp_address(name):
    for peer_name, _rank, tcp, _unix, _host in rpc.state.current().agent.peers():
        if peer_name == name:
            host, port = tcp.removeprefix("tcp://").rsplit(":", 1)
            return host, int(port)
    raise AssertionError(f"no worker {name}")


def _python_call_is_refused(s, marker):
    """Sends worker1 a PYTHON_CALL whose arguments create `marker` when
    unpickled; returns the answer's payload once it is an EXCEPTION."""
    payload = raw_peer.evil_python_call(marker)
    s.sendall(raw_peer.frame(PYTHON_CALL, 1, payload))
    type_, request_id, answer = raw_peer.read_frame(s)
    assert (type_, request_id) == (EXCEPTION, 1)
    return answer


def test_script_only_refuses_python_and_runs_script_functions_and_builtins():
    with pytest.raises(rpc.CalleePolicyError,
                       match=r"PYTHON_CALL \(a pickled Python call\) refused by worker1: .*script_only=True"):
        rpc.rpc_sync("worker1", funcs.py_add, args=(1, 2))
    with pytest.raises(rpc.CalleePolicyError, match=r"PYTHON_CALL .* refused by worker1"):
        rpc.remote("worker1", funcs.py_add, args=(1, 2)).to_here()
    rref = rpc.remote("worker1", torch.add, args=(X, X))
    assert torch.equal(rref.to_here(), 2 * X)
    with pytest.raises(rpc.CalleePolicyError, match=r"RREF_METHOD_CALL \(a Python method of an RRef's value\) refused"):
        rref.rpc_sync().sum()
    assert torch.equal(rpc.rpc_sync("worker1", funcs.add, args=(X, X)), 2 * X)
    assert torch.equal(rpc.rpc_sync("worker1", torch.add, args=(X, 1)), X + 1)


def test_a_raw_python_call_to_a_script_only_worker_never_runs(tmp_path):
    marker = tmp_path / "unpickled"
    with raw_peer.connect(_tcp_address("worker1"), SECRET, rank=0) as s:
        s.settimeout(20)
        answer = _python_call_is_refused(s, marker)
    assert not marker.exists()
    assert b"script_only=True" in answer


def test_a_script_only_caller_refuses_a_pickled_result(tmp_path):
    marker = tmp_path / "unpickled"
    # As "worker2": once worker1 answered this connection's first request, it
    # sends its own requests to worker2 on it (it had no connection to worker2).
    with raw_peer.connect(_tcp_address("worker1"), SECRET, rank=2) as s:
        s.settimeout(20)
        _python_call_is_refused(s, tmp_path / "not-this-one")
        fut = rpc.rpc_async("worker1", ask, args=("worker2", 3))
        type_, request_id, _ = raw_peer.read_frame(s)
        assert type_ == SCRIPT_CALL
        s.sendall(raw_peer.frame(PYTHON_RET, request_id, pickle.dumps(raw_peer.TouchesFile(marker))))
        with pytest.raises(RuntimeError, match=r"the PYTHON_RET \(a pickled result\) was refused: worker1 runs with "
                                               r"RpcOptions\(script_only=True\)"):
            fut.wait()
    assert not marker.exists()


def test_shipped_code_off_refuses_code_the_caller_sends(tmp_path, monkeypatch):
    # A module only this process can import: worker1 cannot resolve it by name.
    (tmp_path / "policy_only_here.py").write_text(
        "import torch\n\n@torch.jit.script\ndef times_seven(x: torch.Tensor) -> torch.Tensor:\n    return x * 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import policy_only_here

    with pytest.raises(rpc.CalleePolicyError, match=r"shipped code \(TorchScript or AOTInductor package\) of '__torch__.policy_only_here."
                                                    r"times_seven' refused by worker1: RpcOptions\(allow_shipped_code"):
        rpc.rpc_sync("worker1", policy_only_here.times_seven, args=(X,))


def test_the_allowlist_refuses_from_file_and_allows_add(tmp_path):
    private = tmp_path / "private.bin"
    private.write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(rpc.CalleePolicyError, match=r"'aten::from_file' refused by worker2: it is not in worker2's "
                                                    r"RpcOptions\(allowed_callables=...\)"):
        rpc.rpc_sync("worker2", torch.from_file, args=(str(private), False, 4), kwargs={"dtype": torch.uint8})
    assert torch.equal(rpc.rpc_sync("worker2", torch.add, args=(X, X)), 2 * X)  # "aten::add": every overload
    assert torch.equal(rpc.rpc_sync("worker2", "tests.add", args=(X, X)), 2 * X)  # a registered name on the list
    with pytest.raises(rpc.CalleePolicyError, match="'tests.triple' refused by worker2"):
        rpc.rpc_sync("worker2", "tests.triple", args=(X,))


def test_the_allowlist_names_python_functions_by_qualified_name():
    assert rpc.rpc_sync("worker2", funcs.py_add, args=(1, 2)) == 3
    with pytest.raises(rpc.CalleePolicyError, match="'tests.multiprocess.funcs.pid' refused by worker2"):
        rpc.rpc_sync("worker2", funcs.pid)


def test_the_allowlist_names_methods_of_an_rref_value_by_class():
    rref = rpc.remote("worker2", torch.add, args=(X, X))
    assert torch.equal(rref.rpc_sync().add(X), 3 * X)  # plain arguments: RREF_METHOD_CALL
    # Not a plain value: a pickled call of torchrpc.rref's method runner, which checks the method.
    assert torch.equal(rref.rpc_sync().add(numpy.float64(1.0)), 2 * X + 1)
    with pytest.raises(rpc.CalleePolicyError, match="'torch.Tensor.sum' refused by worker2"):
        rref.rpc_sync().sum()
    with pytest.raises(rpc.CalleePolicyError, match="'torch.Tensor.sum' refused by worker2"):
        rref.rpc_sync().sum(dtype=torch.float64)


def test_import_by_name_off_refuses_a_name_nobody_registered():
    with pytest.raises(rpc.UnknownFunctionError, match=r"worker2 has no TorchScript function named '__torch__.tests."
                                                       r"multiprocess.funcs.no_tensors'.*allow_import_by_name=False"):
        rpc.rpc_sync("worker2", "__torch__.tests.multiprocess.funcs.no_tensors", args=(3,))
