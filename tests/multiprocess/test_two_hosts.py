"""Two hosts on one machine: two network namespaces, a worker in each,
talking TCP (no Unix socket reaches across namespaces) over a link through a
third namespace, where tests/multiprocess/delay_line.py forwards the frames
(a user-space netem: this machine's kernel has no sch_netem). Rank 0 runs
tests/multiprocess/remote_driver.py in the first namespace and the test asks
it to run calls; the link then gets 1 ms of delay each way (pipelining,
timeouts), and finally goes down (a partition, which only the heartbeat can
detect for a call with timeout=0)."""

import contextlib
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.multiprocess import probes
from tests.multiprocess.cluster import ROOT, spawn, worker_command
from tests.multiprocess.torch_backend_job import TorchBackendJob

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip"),
    reason="needs root and the ip command to make network namespaces")

PORT = 29500  # the store's port inside a fresh namespace: always free there


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _in_ns(ns, *argv):
    return ["ip", "netns", "exec", ns, *argv]


class _Hosts:
    """Namespaces ns[0], ns[1] with interfaces dev[i] at addr[i], linked
    through the middle namespace `mid` (its ends mdev[i]) by the delay line,
    and the job on them."""

    def __init__(self, tmp):
        tag = f"{os.getpid() % 10000}{random.randrange(1000)}"  # interface names: 15 chars at most
        self.ns = [f"trpc{tag}a", f"trpc{tag}b"]
        self.mid = f"trpc{tag}m"
        self.dev = [f"trv{tag}a", f"trv{tag}b"]
        self.mdev = [f"trm{tag}a", f"trm{tag}b"]
        subnet = f"10.{random.randrange(100, 250)}.{random.randrange(256)}"
        self.addr = [f"{subnet}.1", f"{subnet}.2"]
        self.tmp = tmp
        self.delay_file = os.path.join(tmp, "delay")
        self.driver = self.worker = self.line = None

    def create(self):
        for ns in (*self.ns, self.mid):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        for ns, dev, mdev, addr in zip(self.ns, self.dev, self.mdev, self.addr):
            _ip("link", "add", dev, "type", "veth", "peer", "name", mdev)
            _ip("link", "set", dev, "netns", ns)
            _ip("link", "set", mdev, "netns", self.mid)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            for where, d in ((ns, dev), (self.mid, mdev)):
                _ip("-n", where, "link", "set", d, "up")
                subprocess.run(_in_ns(where, sys.executable, "-m", "tests.multiprocess.delay_line", "--offloads-off", d),
                               check=True, cwd=ROOT, timeout=30)
            _ip("-n", self.mid, "link", "set", mdev, "promisc", "on")
        self.line = subprocess.Popen(_in_ns(self.mid, sys.executable, "-m", "tests.multiprocess.delay_line",
                                            *self.mdev, self.delay_file), cwd=ROOT)

    def start(self):
        env = {"MASTER_ADDR": self.addr[0], "MASTER_PORT": str(PORT), "WORLD_SIZE": "2",
               "TORCHRPC_HEARTBEAT_SECONDS": str(probes.HEARTBEAT_SECONDS)}
        self.worker = spawn(["ip", "netns", "exec", self.ns[1],
                             *worker_command(1, 2, "env://")], self.log_path("worker1"), dict(env, RANK="1"))
        with open(self.log_path("worker0"), "w") as log:
            self.driver = subprocess.Popen(
                ["ip", "netns", "exec", self.ns[0], sys.executable, "-m", "tests.multiprocess.remote_driver",
                 "--init-method", f"tcp://{self.addr[0]}:{PORT}"],
                cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", **env),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self._reply(90) == "joined"

    def log_path(self, name):
        return os.path.join(self.tmp, f"{name}.log")

    def ask(self, fn, *args, timeout=30):
        """Runs remote_driver.<fn>(*args) on rank 0; its value, or raises with its error."""
        self.driver.stdin.write(json.dumps({"fn": fn, "args": args}) + "\n")
        self.driver.stdin.flush()
        return self._reply(timeout)

    def _reply(self, timeout):
        ready, _, _ = select.select([self.driver.stdout], [], [], timeout)
        line = self.driver.stdout.readline() if ready else ""
        if not line:
            self.dump_stacks()
            raise AssertionError(f"rank 0 gave no answer within {timeout} s (stacks and logs above)")
        reply = json.loads(line)
        if not reply["ok"]:
            raise AssertionError(f"rank 0: {reply['type']}: {reply['error']}")
        return reply["value"]

    def dump_stacks(self):
        for proc in (self.driver, self.worker):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGUSR1)  # ip netns exec execs: the pid is Python's
        time.sleep(1.0)
        for name in ("worker0", "worker1"):
            with open(self.log_path(name)) as f:
                sys.stderr.write(f"\n===== {name} log =====\n{f.read()[-20000:]}")

    def delay(self, seconds):
        """Each frame crosses the link `seconds` late, each way (within 50 ms)."""
        with open(self.delay_file, "w") as f:
            f.write(str(seconds))
        time.sleep(0.1)

    def partition(self):
        """Takes both ends of the link down: packets are dropped, nothing is reset."""
        for ns, dev in zip(self.ns, self.dev):
            _ip("-n", ns, "link", "set", dev, "down")

    def destroy(self):
        for proc in (self.driver, self.worker, self.line):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        if self.driver is not None:
            self.driver.stdin.close()
            self.driver.stdout.close()
        for ns in (*self.ns, self.mid):  # deleting a namespace deletes its veth ends, and with them the pairs
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    h = _Hosts(str(tmp_path_factory.mktemp("two-hosts")))
    try:
        h.create()
        h.start()
        yield h
    finally:
        h.destroy()


@contextlib.contextmanager
def _delayed(hosts):
    """The link with 1 ms of delay each way."""
    hosts.delay(0.001)
    try:
        yield
    finally:
        hosts.delay(0)


def test_calls_over_tcp_between_namespaces(hosts):
    seen = hosts.ask("functional", 8)
    # each worker listens on its veth address (listen_host: the interface that reaches the master)
    assert seen["peer_addresses"][0].startswith(f"tcp://{hosts.addr[1]}:"), seen
    assert seen["my_addresses"][0].startswith(f"tcp://{hosts.addr[0]}:"), seen


def test_calls_pipeline_over_a_delayed_link(hosts):
    with _delayed(hosts):
        one = hosts.ask("latency", 5)
        many = hosts.ask("pipelined", 100)
    assert one >= 0.002, f"one call took {one * 1e3:.2f} ms: the link's 2 ms round trip did not apply"
    assert many < 100 * 0.002 / 2, f"100 calls in flight took {many * 1e3:.0f} ms; one after another take 200 ms"


def test_timeouts_fire_on_time_over_a_delayed_link(hosts):
    with _delayed(hosts):
        took, error = hosts.ask("timed_call", "sleep", [2.0], 0.5)
    assert error is not None and error[0] == "RpcTimeoutError", error
    assert 0.5 <= took < 0.8, f"a 0.5 s timeout fired after {took:.2f} s"


def test_a_partition_fails_a_call_without_timeout_within_the_heartbeat(hosts):
    assert hosts.ask("timed_call", "pid", [], 0)[1] is None  # connected, answering
    hosts.partition()  # the module ends with this test
    took, error = hosts.ask("timed_call", "pid", [], 0, timeout=probes.HEARTBEAT_BOUND + 10)
    assert error is not None and error[0] == "PeerUnreachableError", error
    assert "worker1" in error[1] and "stopped responding" in error[1], error[1]
    assert took < probes.HEARTBEAT_BOUND, f"the partition was detected after {took:.1f} s"


# Functional modules that run again with their workers on a second host
# (remote_host.py): calls of every kind and size, the RRef protocol among three
# workers, and TorchScript RPC, over TCP between namespaces. Distributed
# autograd and the optimizer add only message kinds on the same frames, so
# they run on one host only (20 s of CI).
FUNCTIONAL = ["test_calls.py", "test_rref.py", "test_script_rpc.py"]


def test_functional_modules_pass_with_workers_on_another_host():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         *(os.path.join("tests", "multiprocess", m) for m in FUNCTIONAL)],
        cwd=ROOT, env=dict(os.environ, TORCHRPC_TEST_REMOTE_HOST="1"), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1], done.stdout[-2000:]


def _backend_calls_on_rank0():
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    from torch.testing import assert_close

    from tests.multiprocess import torch_backend_funcs as F

    a, b = torch.ones(3), torch.arange(3.0)
    assert_close(rpc.rpc_sync("worker1", torch.add, args=(a, b)), a + b)
    assert_close(rpc.rpc_sync("worker1", F.add, args=(a, b)), a + b)
    assert_close(rpc.rpc_sync("worker1", F.script_add, args=(a, b)), a + b)
    assert_close(rpc.remote("worker1", F.add, args=(a, 1)).to_here(), a + 1)
    big = torch.randn(1 << 20)  # 4 MB: many TCP segments
    assert_close(rpc.rpc_sync("worker1", F.add, args=(big, big)), 2 * big)
    x = torch.rand(3, requires_grad=True)
    with dist_autograd.context() as ctx:
        dist_autograd.backward(ctx, [rpc.rpc_sync("worker1", torch.mul, args=(x, 3.0)).sum()])
        assert_close(dist_autograd.get_gradients(ctx)[x], torch.full((3,), 3.0))
    print("backend across hosts: checked", flush=True)
    rpc.shutdown()  # graceful: worker1's meets it


def test_the_torch_backend_calls_over_tcp_between_namespaces(tmp_path):
    # torch.distributed.rpc's TORCHRPC backend on the same transport: no Unix
    # socket reaches across namespaces, so only TCP can carry these calls.
    h = _Hosts(str(tmp_path))
    try:
        h.create()
        job = TorchBackendJob(2, driver=f"{__name__}:_backend_calls_on_rank0",
                              init_method=f"tcp://{h.addr[0]}:{PORT}", prefix=lambda rank: ["ip", "netns", "exec", h.ns[rank]])
        with job:
            codes = job.wait_exits(timeout=90)
            log = job.log(0)
    finally:
        h.destroy()
    assert codes == {0: 0, 1: 0} and "backend across hosts: checked" in log, (log, job.log(1))
