"""The demo and the benchmark runner keep running (a short --quick run)."""

import json
import os

import pytest

from tests.smoke.test_tutorials import ROOT, run  # noqa: F401


@pytest.mark.timeout(180)
def test_demo():
    out = run(["tutorials/demo.py"], timeout=170)
    for word in ("TorchScript", "builtin", "Python", "torch.distributed.rpc"):
        assert word in out, out


@pytest.mark.timeout(240)
def test_benchmarks_quick(tmp_path):
    # Both launch modes: the main job, the compute-heavy callee, and the loop beside workers.
    # Not the TORCHRPC backend's rows: its main job adds ~30 s (both modes) to CI.
    run(["benchmarks/run_all.py", "--quick", "--jobs", "main,compute,beside", "--backends", "torch,torchrpc",
         "--out", str(tmp_path)], timeout=230)
    files = os.listdir(tmp_path)
    assert any(f.endswith(".png") for f in files), files
    results = [f for f in files if f.endswith(".json")]
    assert results, files
    with open(tmp_path / results[0]) as f:
        data = json.load(f)
    assert data, "empty benchmark results"
    assert set(data["raw"]) == {"one", "separate"}, data["raw"].keys()
    assert not data["errors"], data["errors"]


@pytest.mark.timeout(120)
def test_scaling_probe_reports_rounds_against_the_ceiling():
    out = run(["benchmarks/scaling_probe.py", "--rounds", "2", "--round-s", "0.1"], timeout=110)
    lines = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in ("0", "1", "median")]
    assert [line[0] for line in lines] == ["0", "1", "median"], out
    for line in lines:  # ceiling, 1 caller, 2 callers, 2/1, 2/1 over the ceiling
        assert float(line[1].rstrip("x")) > 0 and float(line[3].rstrip("/s")) > 0, out


@pytest.mark.timeout(120)
def test_training_steps_reports_each_step_of_both_iterations():
    out = run(["benchmarks/training_steps.py", "--iterations", "20"], timeout=110)
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()}
    for label, steps in (("distributed", ("embedding", "lstm", "decoder+loss", "backward", "step", "context exit")),
                         ("local", ("embedding", "lstm", "decoder+loss", "backward", "step")),
                         ("calls", ("builtin after compute", "builtin again"))):
        assert label in rows, out
        for step in steps:
            assert f" {step} " in rows[label], rows[label]
        assert "(sum " in rows[label] and " 0 µs)" not in rows[label], rows[label]
