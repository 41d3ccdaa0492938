"""The README's runnable programs keep running: each is started as a user
would start it and must finish cleanly with its key output."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args, timeout):
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


@pytest.mark.timeout(180)
def test_batch_rpc_tutorial_trains():
    out = run(["tutorials/batch_rpc.py", "--trainers", "2", "--rounds", "10"], timeout=170)
    assert "server: 10 rounds" in out, out
    losses = [float(m.group(1)) for m in re.finditer(r"^trainer1: round +\d+  loss ([0-9.]+)$", out, re.M)]
    assert len(losses) >= 2 and losses[-1] < losses[0] / 4, out


@pytest.mark.timeout(240)
def test_torchscript_deployment_tutorial_serves_from_cpp():
    out = run(["tutorials/torchscript_deployment.py"], timeout=230)
    assert "server: joined a job of 4 workers" in out and "client: done" in out, out
    served = re.search(r"server\.forward\(\[[^\]]*\]\) = (\[[^\]]*\])", out)
    local = re.search(r"the same model run here gives (\[[^\]]*\])", out)
    assert served and local and served.group(1) == local.group(1), out


@pytest.mark.timeout(180)
def test_rl_cartpole_tutorial_runs_episodes():
    out = run(["tutorials/rl_cartpole.py", "--observers", "2", "--episodes", "20"], timeout=170)
    rewards = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("episode")]
    assert len(rewards) == 2 and all(r > 0 for r in rewards), out


@pytest.mark.timeout(180)
def test_distributed_rnn_tutorial_loss_falls():
    out = run(["tutorials/distributed_rnn.py", "--epochs", "4", "--steps", "10"], timeout=170)
    losses = [float(m.group(1)) for m in re.finditer(r"^epoch +\d+  loss ([0-9.]+)$", out, re.M)]
    assert len(losses) == 4 and losses[-1] < 0.75 * losses[0], out


@pytest.mark.timeout(120)
def test_torchscript_to_export_tutorial_serves_both_ways():
    out = run(["tutorials/torchscript_to_export.py"], timeout=110)  # ~25 s, most of it the AOTInductor compile
    assert re.search(r"compiled it with AOTInductor in [0-9.]+ s", out), out
    assert "both agree with the model run here: True" in out, out
    for label in ("mlp.script", "mlp.export", "the program"):
        assert re.search(rf"client: {label} +median +\d+ µs", out), out
    assert "outside the bounds of its dynamic dimension" in out and "client: done" in out, out
