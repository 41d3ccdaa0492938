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


def _quick_run(out, jobs, modes):
    """A --quick run of torch and torchrpc; its results.json, checked to hold
    the modes asked for, a chart, and no error."""
    run(["benchmarks/run_all.py", "--quick", "--jobs", jobs, "--modes", modes, "--backends", "torch,torchrpc",
         "--out", str(out)], timeout=170)
    files = os.listdir(out)
    assert any(f.endswith(".png") for f in files), files
    with open(out / "results.json") as f:
        data = json.load(f)
    assert set(data["raw"]) == set(modes.split(",")), data["raw"].keys()
    assert not data["errors"], data["errors"]
    # The machine's speed was probed before every job that ran.
    probed = {where for where, ms in data["meta"]["speed_probes_ms"].items() if len(ms) == 1 and ms[0] > 0}
    ran = {f"{mode}/{name}/{job}" for mode, by_name in data["raw"].items() for name, jobs in by_name.items()
           for job in jobs}
    assert probed == ran, (probed, ran)
    return data


@pytest.mark.timeout(240)
def test_benchmarks_quick(tmp_path):
    # Every job of CI's interest once and each launch mode once (each job in
    # both modes took 117 s of the suite): the main job and the loop beside
    # workers in separate sessions, the compute-heavy callee in both, so the
    # report's two-mode layout is read too. Not the TORCHRPC backend's rows
    # (its main job adds ~30 s).
    data = _quick_run(tmp_path / "separate", "main,beside", "separate")
    assert set(data["raw"]["separate"]["torchrpc"]) == {"main", "beside"}, data["raw"]
    data = _quick_run(tmp_path / "both", "compute", "one,separate")
    assert all(set(data["raw"][mode]["torch"]) == {"compute"} for mode in ("one", "separate")), data["raw"]


@pytest.mark.timeout(150)
def test_rounds_take_turns_and_keep_their_own_control_keys(tmp_path):
    # The loop beside workers reads the workers' pids from the control
    # store: a second round that found the first round's pids failed.
    out = run(["benchmarks/run_all.py", "--quick", "--jobs", "beside", "--modes", "one", "--backends", "torchrpc",
               "--rounds", "2", "--out", str(tmp_path)], timeout=140)
    assert "round 2/2" in out, out
    with open(tmp_path / "results.json") as f:
        data = json.load(f)
    assert not data["errors"], data["errors"]
    assert data["meta"]["rounds"] == 2
    assert len(data["meta"]["speed_probes_ms"]["one/torchrpc/beside"]) == 2
    assert data["raw"]["one"]["torchrpc"]["beside"]["beside"]["idle"], data["raw"]


def test_rounds_are_merged_into_medians():
    from benchmarks import report

    rounds = [{"latency": {"script": {"median": 120.0, "n": 200}}, "sizes": [1, 2], "label": "a"},
              {"latency": {"script": {"median": 80.0, "n": 200}}, "sizes": [3, 4], "label": "b"},
              {"latency": {"script": {"median": 95.0, "n": 200}}, "sizes": [2, 9]}]
    assert report.median_of_rounds(rounds) == {
        "latency": {"script": {"median": 95.0, "n": 200}}, "sizes": [2, 4], "label": "a"}
    # A key that a round lacks (a scenario that failed there) is the median of the others.
    assert report.median_of_rounds([{"a": 1.0, "b": 5.0}, {"a": 3.0}]) == {"a": 2.0, "b": 5.0}


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


def _call_segments(*args):
    """call_segments.py's output for `args`, and its step rows by step name
    (each checked to have taken some time)."""
    out = run(["benchmarks/call_segments.py", *args], timeout=110)
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    for step in ("issue", "callee", "complete", "total"):
        assert step in rows and float(rows[step][1]) > 0, out
    return out, rows


@pytest.mark.timeout(120)
def test_call_segments_reports_each_step_of_a_call():
    out, rows = _call_segments("--calls", "300", "--warmup", "100", "--compute-us", "100")
    assert "each after 100 µs of compute" in out, out
    # A tiny script call runs on the thread that read it once proven short
    # (csrc/script_dispatch/inline_calls.h), its first ones on the pool.
    assert rows["callee"][-1] in ("rpc-io", "rpc-pool") and "to" in rows, out
    assert "caller's waiting thread woken:" in out, out


@pytest.mark.timeout(120)
def test_call_segments_times_the_split_rnn_proxy_call_in_an_autograd_context():
    out, rows = _call_segments("--kind", "proxy", "--calls", "200", "--warmup", "50")
    assert "rpc_sync of a proxy call:" in out, out
    # A method of a Python object runs under the GIL on a pool thread.
    assert rows["callee"][-1] == "rpc-pool", out


def _paired_workers():
    """Pids of benchmarks/paired.py workers still alive."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"benchmarks.paired\0--worker" in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


@pytest.mark.timeout(150)
def test_paired_blocks_compare_sides_in_the_same_phases(tmp_path):
    # Two sides of torchrpc, one with a setting (how a change is A/B'd): each
    # block pair has a value for both and a speed probe, the report names
    # both, and no worker (stopped between blocks) is left behind.
    out = run(["benchmarks/paired.py", "--sides", "torchrpc,torchrpc@TORCHRPC_SPIN_US=0", "--modes", "separate",
               "--kinds", "script,async_builtin", "--blocks", "2", "--block-s", "0.1",
               "--out", str(tmp_path / "paired.json")], timeout=140)
    assert "torchrpc@TORCHRPC_SPIN_US=0:" in out and "async_builtin" in out, out
    with open(tmp_path / "paired.json") as f:
        data = json.load(f)
    for kind in ("script", "async_builtin"):
        rows = data["blocks"]["separate"][kind]
        assert len(rows) == 2, rows
        assert all(r["probe_ms"] > 0 and r["torchrpc"] > 0 and r["torchrpc@TORCHRPC_SPIN_US=0"] > 0 for r in rows), rows
        assert data["summary"]["separate"][kind]["all"]["torchrpc@TORCHRPC_SPIN_US=0"] > 0
    assert _paired_workers() == []


def test_paired_speedups_are_per_block_pair_and_by_phase():
    from benchmarks import paired

    # Tiny calls in µs (lower is faster), calls in flight per second (higher).
    rows = [{"probe_ms": 1.0, "a": 100.0, "b": 25.0}, {"probe_ms": 1.9, "a": 300.0, "b": 100.0},
            {"probe_ms": 2.0, "a": 200.0, "b": 100.0}]
    s = paired.summarize(rows, "script", ["a", "b"])
    assert s["median"] == {"a": 200.0, "b": 100.0}
    assert (s["all"]["b"], s["fast"]["b"], s["slow"]["b"]) == (3.0, 4.0, 2.5)
    assert (s["fast"]["blocks"], s["slow"]["blocks"]) == (1, 2)
    rows = [{"probe_ms": 1.0, "a": 1000.0, "b": 3000.0}]
    s = paired.summarize(rows, "async_script", ["a", "b"])
    assert s["all"]["b"] == 3.0 and s["slow"] == {"blocks": 0, "b": None}
