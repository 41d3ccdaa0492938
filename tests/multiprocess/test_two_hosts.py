"""Two hosts on one machine: two network namespaces joined by a veth pair,
a worker in each, talking TCP over the veth (no Unix socket reaches across
namespaces). Rank 0 runs tests/multiprocess/remote_driver.py in the first
namespace and the test asks it to run calls; `tc netem` then delays the link
(pipelining, timeouts; skipped where the kernel has no netem qdisc), and
finally the link goes down (a partition, which only the heartbeat can detect
for a call with timeout=0)."""

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

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"),
    reason="needs root and the ip and tc commands to make network namespaces")

PORT = 29500  # the store's port inside a fresh namespace: always free there


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class _Hosts:
    """Namespaces ns[0], ns[1] with veth ends dev[i] at addr[i], and the job on them."""

    def __init__(self, tmp):
        tag = f"{os.getpid() % 10000}{random.randrange(1000)}"  # interface names: 15 chars at most
        self.ns = [f"trpc{tag}a", f"trpc{tag}b"]
        self.dev = [f"trv{tag}a", f"trv{tag}b"]
        subnet = f"10.{random.randrange(100, 250)}.{random.randrange(256)}"
        self.addr = [f"{subnet}.1", f"{subnet}.2"]
        self.tmp = tmp
        self.driver = self.worker = None

    def create(self):
        for ns in self.ns:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
        for ns, dev, addr in zip(self.ns, self.dev, self.addr):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")

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

    def netem(self, *spec, required=True):
        """Applies `tc ... netem <spec>` to both ends of the link. Where the
        kernel has no netem qdisc: skips the test if `required`, else returns False."""
        for ns, dev in zip(self.ns, self.dev):
            done = subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "netem", *spec],
                                  capture_output=True, text=True, timeout=10)
            if "qdisc kind is unknown" in done.stderr:
                if required:
                    pytest.skip("this kernel has no netem qdisc (sch_netem) to delay the link")
                return False
            assert done.returncode == 0, done.stderr
        return True

    def partition(self):
        """Takes both ends of the link down: packets are dropped, nothing is reset."""
        for ns, dev in zip(self.ns, self.dev):
            _ip("-n", ns, "link", "set", dev, "down")

    def clear_netem(self):
        for ns, dev in zip(self.ns, self.dev):
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True, timeout=10)

    def destroy(self):
        for proc in (self.driver, self.worker):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for ns in self.ns:  # deleting a namespace deletes its veth end, and with it the pair
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
def _delayed(hosts, required=True):
    """The link with 1 ms of delay each way (when netem exists or is required)."""
    try:
        yield hosts.netem("delay", "1ms", required=required)
    finally:
        hosts.clear_netem()


def test_calls_over_tcp_between_namespaces(hosts):
    seen = hosts.ask("functional", 8)
    # each worker listens on its veth address (listen_host: the interface that reaches the master)
    assert seen["peer_addresses"][0].startswith(f"tcp://{hosts.addr[1]}:"), seen
    assert seen["my_addresses"][0].startswith(f"tcp://{hosts.addr[0]}:"), seen


def test_calls_pipeline_over_a_delayed_link(hosts):
    with _delayed(hosts):
        one = hosts.ask("latency", 5)
        many = hosts.ask("pipelined", 100)
    assert one >= 0.002, f"one call took {one * 1e3:.2f} ms: netem's 2 ms round trip did not apply"
    assert many < 100 * 0.002 / 2, f"100 calls in flight took {many * 1e3:.0f} ms; one after another take 200 ms"


def test_timeouts_fire_on_time_over_a_delayed_link(hosts):
    # where the kernel has no netem, over the plain link: still TCP between hosts
    with _delayed(hosts, required=False):
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
