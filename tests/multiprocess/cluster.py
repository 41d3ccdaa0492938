"""A small RPC job for tests: this pytest process is rank 0, the other ranks
are subprocesses running :mod:`tests.multiprocess.worker`.

Start one per test module (each process imports torch, which costs seconds
here) and run many tests against it::

    @pytest.fixture(scope="module")
    def job():
        with Cluster(3) as c:
            yield c

Workers serve calls until rank 0 tells them to shut down (gracefully, so the
fixture's teardown also tests ``shutdown()``); they die with this process,
and they print every thread's stack on SIGUSR1, which :func:`watchdog` sends
before a hung test times out.
"""

import contextlib
import faulthandler
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import torchrpc as rpc
from torchrpc import state
from tests.multiprocess import remote_host
from tests.multiprocess.worker import stops_on_signal

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_live = set()  # clusters whose processes may need a stack dump


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_command(rank, world_size, init_method, *, name=None, threads=4, options=None, extra=()):
    if options:
        extra = (*extra, "--options", json.dumps(options))
    return [
        sys.executable, "-m", "tests.multiprocess.worker",
        "--rank", str(rank), "--world-size", str(world_size),
        "--init-method", init_method, "--name", name or f"worker{rank}",
        "--threads", str(threads), *extra,
    ]


def spawn(cmd, log_path, env=None):
    """Starts a worker subprocess logging to log_path."""
    full_env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    log = open(log_path, "w")
    try:
        return subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=_default_sigint)
    finally:
        log.close()


def _default_sigint():
    # A job started in the background of a shell without job control ignores
    # SIGINT, and so would the workers: they take Ctrl-C as a terminal's would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Cluster:
    """World of `world_size` workers named worker0..N-1; rank 0 is this process.

    Args:
        world_size: number of workers, including this process.
        threads: num_worker_threads of every worker.
        rpc_timeout: default call timeout in seconds.
        worker_env: {rank: {variable: value}}, extra environment of some workers.
        upstream_spelling: this process joins as a program written for
            torch.distributed.rpc does (its BackendType and options class).
        secret: the job's secret (bytes), for tests that speak the wire
            themselves; None lets rank 0 make one.
        worker_options: {rank: {RpcOptions keyword: value}} of some workers
            (JSON values). Those whose callee policy may refuse Python calls
            are stopped with a signal (worker.stops_on_signal).
        options: {RpcOptions keyword: value} of every rank, this one too.
    """

    def __init__(self, world_size, *, init="tcp", threads=4, rpc_timeout=30.0, programs=None, worker_env=None,
                 upstream_spelling=False, secret=None, worker_options=None, options=None):
        self.world_size = world_size
        self.names = [f"worker{r}" for r in range(world_size)]
        self.threads = threads
        self.rpc_timeout = rpc_timeout
        self.dir = tempfile.mkdtemp(prefix="torchrpc-test-")
        self.procs = {}  # rank -> Popen
        self._final_logs = {}  # rank -> its log, once the folder is deleted
        self.init = init
        # rank -> function(port) giving the argv of a non-Python worker (it
        # shuts down gracefully by itself, so it gets no stop request)
        self.programs = programs or {}
        self.worker_env = worker_env or {}  # rank -> extra environment of that worker
        self.upstream_spelling = upstream_spelling
        self.secret = secret
        self.options = dict(options or {})
        self.worker_options = {rank: {**self.options, **(worker_options or {}).get(rank, {})}
                               for rank in range(1, world_size) if self.options or rank in (worker_options or {})}
        port = free_port()
        self.port = port
        # how this process joins (init_rpc keyword arguments), and how workers do
        self.env = {}
        self.worker_args = []
        master = remote_host.master_address()
        if init == "tcp":
            self.init_method = f"tcp://{master}:{port}"
        elif init == "file":
            self.init_method = "file://" + os.path.join(self.dir, "rendezvous")
        elif init == "env":  # what torchrun sets; workers read their rank from RANK
            self.init_method = "env://"
            self.env = {"MASTER_ADDR": master, "MASTER_PORT": str(port),
                        "WORLD_SIZE": str(world_size)}
        elif init == "store":
            self.init_method = None
            self.worker_args = ["--store", f"{master}:{port}"]
        else:
            raise ValueError(f"unknown init {init!r}")

    def log_path(self, rank):
        return os.path.join(self.dir, f"worker{rank}.log")

    def log(self, rank):
        if rank in self._final_logs:  # the job is over and its folder gone
            return self._final_logs[rank]
        with open(self.log_path(rank)) as f:
            return f.read()

    def __enter__(self):
        _live.add(self)
        options = dict(num_worker_threads=self.threads, rpc_timeout=self.rpc_timeout, init_timeout=60, **self.options)
        secret_env = {}
        if self.secret is not None:
            options["secret"] = self.secret
            secret_env = {"TORCHRPC_SECRET": self.secret.decode()}
        if self.init == "store":
            import torch.distributed as dist

            host, port = self.worker_args[1].split(":")
            options["store"] = dist.TCPStore(host, int(port), self.world_size, is_master=True,
                                             wait_for_workers=False)
        else:
            options["init_method"] = self.init_method
        for rank in range(1, self.world_size):
            if rank in self.programs:
                cmd = self.programs[rank](self.port)
            else:
                cmd = worker_command(rank, self.world_size, self.init_method or "env://", threads=self.threads,
                                     options=self.worker_options.get(rank), extra=self.worker_args)
            self.procs[rank] = spawn(remote_host.command(cmd), self.log_path(rank),
                                     env=dict(self.env, RANK=str(rank), **secret_env, **self.worker_env.get(rank, {})))
        try:
            with _environment(self.env):
                if self.upstream_spelling:
                    import torch.distributed.rpc as upstream

                    rpc.init_rpc("worker0", backend=upstream.BackendType.TENSORPIPE, rank=0,
                                 world_size=self.world_size,
                                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
                                     num_worker_threads=self.threads, rpc_timeout=self.rpc_timeout,
                                     init_method=self.init_method, _transports=["uv"]))
                else:
                    rpc.init_rpc("worker0", rank=0, world_size=self.world_size,
                                 rpc_backend_options=rpc.RpcOptions(**options))
        except BaseException:
            self.kill_all()
            raise
        return self

    def __exit__(self, *exc):
        try:
            self.stop()
        finally:
            _live.discard(self)
            self._remove_files()

    @contextlib.contextmanager
    def unmanaged(self):
        """Starts the job for a test that ends it itself (shutdown tests);
        kills whatever is left of it afterwards instead of stopping it."""
        self.__enter__()
        try:
            yield self
        finally:
            try:
                if state.current() is not None:  # a failed test must not leave it to the next
                    rpc.shutdown(graceful=False)
            finally:  # the workers go even if that shutdown raised
                self.kill_all()
                _live.discard(self)
                self._remove_files()

    def _remove_files(self):
        """Deletes the job's folder (worker logs, file:// rendezvous); log()
        still answers from what the logs held."""
        self._final_logs = {rank: self.log(rank) for rank in self.procs
                            if os.path.exists(self.log_path(rank))}
        shutil.rmtree(self.dir, ignore_errors=True)

    def kill(self, rank):
        """SIGKILLs worker `rank` and waits for it to be gone."""
        proc = self.procs[rank]
        proc.kill()
        proc.wait(timeout=10)

    def kill_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    def ask_to_stop(self, rank, graceful):
        """Makes worker `rank` call shutdown(graceful) on its main thread."""
        from tests.multiprocess import funcs

        try:
            rpc.rpc_sync(rank, funcs.stop_worker, args=(graceful,), timeout=10)
        except rpc.PeerUnreachableError:
            # a worker stopping non-gracefully may close before it answers:
            # then its exit code tells whether it stopped well
            if graceful:
                raise

    def alive(self):
        return [r for r, p in self.procs.items() if p.poll() is None]

    def stop(self, timeout=30):
        """Shuts the job down, gracefully unless a test killed a worker, and
        raises with the workers' logs if one did not exit cleanly."""
        alive = self.alive()
        graceful = len(alive) == len(self.procs)
        problems = []
        try:
            for rank in alive:
                if rank in self.programs:
                    continue
                if stops_on_signal(self.worker_options.get(rank, {})):  # see worker.py
                    self.procs[rank].send_signal(signal.SIGTERM if graceful else signal.SIGUSR2)
                    continue
                try:
                    self.ask_to_stop(rank, graceful)
                except Exception as exc:
                    problems.append(f"worker{rank} did not take the stop request: {exc}")
            rpc.shutdown(graceful=graceful and not problems, timeout=timeout)
        finally:
            for rank in alive:
                try:
                    code = self.procs[rank].wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.dump_stacks()
                    self.procs[rank].kill()
                    self.procs[rank].wait(timeout=10)
                    code = "nothing (it hung and was killed)"
                if code != 0:
                    problems.append(f"worker{rank} exited with {code}:\n{self.log(rank)}")
            if problems:
                raise AssertionError("\n".join(problems))

    def dump_stacks(self):
        """Prints every thread's stack of every rank to stderr."""
        for rank in self.alive():
            os.kill(self.procs[rank].pid, signal.SIGUSR1)
        time.sleep(1.0)
        for rank in self.procs:
            sys.stderr.write(f"\n===== worker{rank} log (pid {self.procs[rank].pid}) =====\n")
            sys.stderr.write(self.log(rank)[-20000:])
        sys.stderr.write("\n===== worker0 (pytest process) =====\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()


@contextlib.contextmanager
def _environment(values):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_timeout(item):
    marker = item.get_closest_marker("timeout")
    if marker and marker.args:
        return float(marker.args[0])
    value = item.config.getini("timeout")
    return float(value) if value else None


@contextlib.contextmanager
def watchdog(seconds, give_up=None, uncapture=lambda: None, what="the test"):
    """Dumps every live cluster's stacks if the block runs past `seconds`.
    Past `give_up` (when pytest-timeout could not interrupt it: its signal
    handler runs only once the main thread is back in Python) ends the
    whole run, so that a hang fails CI at once instead of stalling it,
    after `uncapture()` (pytest's capture would swallow the stacks)."""
    if not seconds:
        yield
        return

    def fire():
        for c in list(_live):
            c.dump_stacks()

    def end_run():
        uncapture()
        sys.stderr.write(f"\n===== {what} still runs {give_up:.0f} s after it began, and pytest-timeout could not "
                         "interrupt it (its main thread is blocked outside Python): ending the run =====\n")
        fire()
        if not _live:  # dump_stacks shows this process too
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        for c in list(_live):
            c.kill_all()
        os._exit(3)

    timers = [threading.Timer(seconds, fire)] + ([threading.Timer(give_up, end_run)] if give_up else [])
    for timer in timers:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()
