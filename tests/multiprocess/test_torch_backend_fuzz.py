"""The wire fuzzer (tests/multiprocess/fuzz.py) against torch.distributed.rpc's
TORCHRPC backend: a member of the job (claiming rank 2, which the test
leaves idle) sends TORCH_REQUEST frames of upstream's request types, as
upstream's serializers write them, mutated, to worker1. Upstream's decoders
read what the backend lets through (torch_backend/upstream_payloads.h), so
this is their fuzz too. worker1 must live, keep answering a real caller
promptly, and keep its RSS bounded.

Rank 0 runs as a subprocess (torch_backend_job.py's driver) and checks all
of it; the job's secret is set here so that the fuzzer can authenticate.
TORCHRPC_FUZZ_INPUTS and TORCHRPC_FUZZ_SEED work as in test_fuzz.py (this
test sends a quarter as many inputs)."""

import os
import statistics
import time

import pytest
import torch
import torch.distributed.rpc as rpc

from tests.multiprocess import fuzz, probes, raw_peer
from tests.multiprocess import torch_backend_funcs as F
from tests.multiprocess.torch_backend_job import TorchBackendJob

SECRET = "test-backend-fuzz-secret-0123"
INPUTS = int(os.environ.get("TORCHRPC_FUZZ_INPUTS", "20000")) // 4
SEED = int(os.environ.get("TORCHRPC_FUZZ_SEED", "20261202"))
FUZZ_RANK = 2
CHUNK = 500
RSS_GROWTH_LIMIT = 256 << 20


def _latency(calls=5):
    """Median seconds of a builtin rpc_sync to worker1 (10 s timeout: an answer must come)."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1), timeout=10)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def _seeds():
    from torch.distributed.rpc.internal import PythonUDF, _internal_rpc_pickler

    udf = _internal_rpc_pickler.serialize(PythonUDF(F.add, (1, 2), {}))
    return fuzz.backend_seed_frames(FUZZ_RANK, torch._jit_internal._qualified_name(F.script_add), udf)


def _check_seeds(address):
    """Each request seed gets upstream's ordinary answer, so the fuzz reaches past the envelope."""
    names = {v: k for k, v in fuzz.UPSTREAM_TYPES.items()}
    answers = {}
    with raw_peer.connect(address, SECRET.encode(), rank=FUZZ_RANK) as s:
        s.settimeout(10)
        seeds = _seeds()
        for i, (_, data) in enumerate(seeds[:-1]):  # one at a time: the RRef seeds build on each other
            s.sendall(data)
            while i + 1 not in answers:  # each request is answered
                type_, id_, payload = fuzz.read_frame(s)
                if type_ == fuzz.TORCH_REQUEST:
                    continue  # worker1's own (it tells the context's workers that it cleaned context 7 up)
                assert type_ == fuzz.TORCH_RESPONSE, (type_, payload[:200])
                answers[id_] = (names.get(int.from_bytes(payload[:4], "little")), payload)
        s.sendall(seeds[-1][1])  # the response to nothing, which nothing answers
    wrong = {seeds[i - 1][0]: p[:300] for i, (name, p) in answers.items()
             if name == "EXCEPTION" and seeds[i - 1][0] not in ("BACKWARD_AUTOGRAD_REQ", "RREF_BACKWARD_REQ")}
    assert not wrong, wrong


def _fuzz_on_rank0():
    tcp = rpc.rpc_sync("worker1", F.agent_address)
    host, port = tcp.removeprefix("tcp://").rsplit(":", 1)
    address = (host, int(port))
    _check_seeds(address)
    seeds = [data for _, data in _seeds()]
    pid = rpc.rpc_sync("worker1", os.getpid)
    _latency()  # warm-up
    baseline = _latency(calls=9)
    rss = peak = probes.rss_bytes(pid)
    slow = []
    for chunk in range(max(1, INPUTS // CHUNK)):
        reproduce = f"TORCHRPC_FUZZ_SEED={SEED} chunk {chunk} of {CHUNK} inputs (seed {SEED + chunk})"
        fuzz.run(address, SECRET.encode(), FUZZ_RANK, SEED + chunk, CHUNK, seeds)
        try:
            latency = _latency(calls=3)
        except Exception as exc:
            raise AssertionError(f"{reproduce}: worker1 stopped answering: {exc}") from exc
        if latency >= max(2 * baseline, 0.05):
            slow.append(latency)
        peak = max(peak, probes.rss_bytes(pid))
    assert len(slow) <= 2, f"{len(slow)} probes slower than {max(2 * baseline, 0.05) * 1e3:.0f} ms: {slow}"
    assert peak - rss < RSS_GROWTH_LIMIT, f"worker1's RSS grew by {(peak - rss) >> 20} MB"
    print(f"fuzz: checked {INPUTS} inputs; baseline {baseline * 1e6:.0f} us, RSS +{(peak - rss) >> 20} MB",
          flush=True)


@pytest.mark.timeout(max(180, INPUTS // 40))
def test_a_backend_worker_survives_fuzzed_upstream_messages(monkeypatch):
    monkeypatch.setenv("TORCHRPC_SECRET", SECRET)
    with TorchBackendJob(3, driver=f"{__name__}:_fuzz_on_rank0") as job:
        driver = job.procs[0]
        try:
            code = driver.wait(timeout=max(150, INPUTS // 50))
        except Exception:
            job.dump_stacks()
            raise
        log, worker1, alive = job.log(0), job.log(1), job.procs[1].poll() is None
    assert code == 0 and "fuzz: checked" in log, f"{log[-4000:]}\n===== worker1 =====\n{worker1[-3000:]}"
    assert alive, worker1[-3000:]
