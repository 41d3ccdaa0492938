"""The wire fuzzer (issue #21, item 5): a member of the job (claiming rank
2, a worker the tests leave idle) sends valid frames of every message type,
mutated (tests/multiprocess/fuzz.py), to worker1 while this process keeps
calling it. worker1 must live, answer within max(2x its usual latency,
50 ms), and keep its RSS bounded.

CI sends 20k inputs; TORCHRPC_FUZZ_INPUTS=1000000 is the long mode, and
TORCHRPC_FUZZ_SEED picks another deterministic sequence (the seed is in
every failure message)."""

import os
import pickle
import subprocess
import sys
import time

import pytest

import torchrpc as rpc
from torchrpc import callables, python_fallback
from tests.multiprocess import funcs, fuzz, probes, raw_peer
from tests.multiprocess.cluster import ROOT, Cluster

SECRET = b"test-fuzz-job-secret-0123"
INPUTS = int(os.environ.get("TORCHRPC_FUZZ_INPUTS", "20000"))
SEED = int(os.environ.get("TORCHRPC_FUZZ_SEED", "20261126"))
FUZZ_RANK = 2
RSS_GROWTH_LIMIT = 256 << 20


@pytest.fixture(scope="module")
def job():
    # rank 2 exists so that the fuzzer can claim it; its GOODBYEs and RRef
    # forks then concern a worker this test does not use.
    with Cluster(3, secret=SECRET) as c:
        yield c


def _seeds():
    def python_call(fn, args):
        digest, data = callables.pickle_function(fn)
        return python_fallback.pickled_call(digest, data, callables.function_name(fn), args, {}, 1)[:2]

    return fuzz.seed_frames(FUZZ_RANK, python_call(funcs.py_add, (1, 2)), python_call(funcs.Counter, (5,)))


# What worker1 answers each request seed with: (response type, whether an EXCEPTION is right).
_ANSWERS = {
    # py_add(1, 2): a plain result (an int) comes back as an IValue, not a pickle
    "SCRIPT_CALL": "SCRIPT_RET", "BUILTIN_CALL": "SCRIPT_RET", "PYTHON_CALL": "SCRIPT_RET",
    "REMOTE_CALL": "SCRIPT_RET", "RREF_FETCH": "PYTHON_RET", "RREF_METHOD_CALL": "SCRIPT_RET",
    "RREF_FORK_REQUEST": "SCRIPT_RET", "RREF_CHILD_ACCEPT": "SCRIPT_RET", "RREF_USER_DELETE": "SCRIPT_RET",
    "AUTOGRAD_CALL": "AUTOGRAD_RET", "AUTOGRAD_PASS_DONE": "SCRIPT_RET", "AUTOGRAD_CLEANUP": "SCRIPT_RET",
    # context 7 has no send function #3 here: the right answer is an error naming it
    "AUTOGRAD_BACKWARD": "EXCEPTION",
}


def test_seed_frames_are_valid(job):
    """The fuzzer mutates frames that worker1 accepts: each request seed gets
    its ordinary answer (so the fuzz reaches past the frame parser)."""
    names = {v: k for k, v in fuzz.TYPES.items()}
    with raw_peer.connect(probes.tcp_address("worker1"), SECRET, rank=FUZZ_RANK) as s:
        s.settimeout(10)
        for i, (name, data) in enumerate(_seeds()):
            s.sendall(data)
            if name in _ANSWERS:
                type_, id_, payload = fuzz.read_frame(s)
                assert (names.get(type_), id_) == (_ANSWERS[name], i + 1), (name, payload[:300])
    assert rpc.rpc_sync("worker1", funcs.debug_info)["owner_rrefs"] == 0  # the seeds delete their RRef


@pytest.mark.timeout(max(120, INPUTS // 250))
def test_worker_survives_fuzzed_frames(job, tmp_path):
    worker = job.procs[1]
    probes.call_latency("worker1")  # warm-up
    baseline = probes.call_latency("worker1", calls=9)
    rss = probes.rss_bytes(worker.pid)
    seeds_path = tmp_path / "seeds.pickle"
    seeds_path.write_bytes(pickle.dumps([data for _, data in _seeds()]))
    host, port = probes.tcp_address("worker1")
    log = tmp_path / "fuzzer.log"
    reproduce = f"TORCHRPC_FUZZ_SEED={SEED} TORCHRPC_FUZZ_INPUTS={INPUTS}"
    with open(log, "w") as out:
        fuzzer = subprocess.Popen(
            [sys.executable, "-m", "tests.multiprocess.fuzz", "--host", host, "--port", str(port),
             "--secret-hex", SECRET.hex(), "--rank", str(FUZZ_RANK), "--seed", str(SEED),
             "--inputs", str(INPUTS), "--seeds", str(seeds_path)],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=out, stderr=subprocess.STDOUT)
    slow, peak = [], rss
    try:
        # while it runs: a real call every 100 ms, and worker1's RSS
        while fuzzer.poll() is None:
            latency = probes.call_latency("worker1", calls=3)
            if latency >= probes.prompt_bound(baseline):
                slow.append(latency)
            peak = max(peak, probes.rss_bytes(worker.pid))
            time.sleep(0.1)
    except rpc.RpcError as exc:
        job.dump_stacks()  # what worker1's threads are stuck in
        raise AssertionError(f"{reproduce}: worker1 stopped answering: {exc}\n{log.read_text()[-1000:]}\n"
                             f"{job.log(1)[-3000:]}") from exc
    finally:
        if fuzzer.poll() is None:
            fuzzer.kill()
        fuzzer.wait()
    report = f"{reproduce}; fuzzer: {log.read_text()[-1000:]}"
    assert fuzzer.returncode == 0, report
    assert 1 in job.alive(), f"worker1 died ({report}):\n{job.log(1)[-3000:]}"
    # a noisy machine may slow one probe in a while; a stuck or starved worker slows many
    assert len(slow) <= 2, (f"{len(slow)} probes slower than {probes.prompt_bound(baseline) * 1e3:.0f} ms: "
                            f"{[round(s * 1e3) for s in slow]} ms ({report})")
    assert peak - rss < RSS_GROWTH_LIMIT, f"worker1's RSS grew by {(peak - rss) >> 20} MB ({report})"
    probes.assert_serves_promptly("worker1", baseline, f"the fuzz ({reproduce})")
