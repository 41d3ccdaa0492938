"""PyTorch's own RPC test suite (shipped in the torch wheel) against the
TORCHRPC backend, the way upstream tests its backends: a fixture that
subclasses upstream's RpcAgentTestFixture, passed to generate_tests() as
torch's test/distributed/rpc/test_tensorpipe_agent.py does.

It holds upstream's generic classes and its TensorPipe-only ones
(TensorPipeAgentRpcTest, TensorPipeAgentDistAutogradTest: sparse tensors,
dynamic jobs, options): the backend is meant to pass whatever TensorPipe
passes here. ``make test-torch-backend`` runs it all (ARGS="-k test_add" picks
tests; ~3 minutes); ``make test`` runs a smoke subset
(test_upstream_smoke.py). Test ids match upstream's CI names with the prefix
TorchRpc: ``TorchRpcRpcTest.test_add``.
"""

import torch.distributed.rpc as rpc
import torch.multiprocessing
from torch.testing._internal.distributed.rpc.rpc_agent_test_fixture import RpcAgentTestFixture
from torch.testing._internal.distributed.rpc_utils import GENERIC_TESTS, TENSORPIPE_TESTS, generate_tests

import torchrpc  # noqa: F401  (registers the backend)


class TorchRpcAgentTestFixture(RpcAgentTestFixture):
    @property
    def rpc_backend(self):
        return rpc.backend_registry.BackendType["TORCHRPC"]

    @property
    def rpc_backend_options(self):
        return rpc.backend_registry.construct_rpc_backend_options(self.rpc_backend, init_method=self.init_method)

    def get_shutdown_error_regex(self):
        # What the backend says when a call's peer or this agent goes away
        # (csrc/agent: the connection's loss; shutdown; a refused connect).
        phrases = ["closed", "shut down", "shutting down", "cannot connect", "no longer running", "exited",
                   "Connection reset", "Broken pipe"]
        return "|".join(f"({p})" for p in phrases)

    def get_timeout_error_regex(self):
        return "RPC ran for more than"

    def _spawn_processes(self):
        # Upstream spawns each rank afresh, which re-imports these suites and
        # recompiles their ~120 TorchScript functions per rank (~25 s a test
        # on 2 cores). A forkserver that imported this module once forks the
        # ranks instead; each rank still runs in a fresh process.
        ctx = torch.multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        self._start_processes(ctx.Process)


globals().update(generate_tests("TorchRpc", TorchRpcAgentTestFixture, GENERIC_TESTS + TENSORPIPE_TESTS, __name__))
