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
    run(["benchmarks/run_all.py", "--quick", "--out", str(tmp_path)], timeout=230)
    files = os.listdir(tmp_path)
    assert any(f.endswith(".png") for f in files), files
    results = [f for f in files if f.endswith(".json")]
    assert results, files
    with open(tmp_path / results[0]) as f:
        data = json.load(f)
    assert data, "empty benchmark results"
