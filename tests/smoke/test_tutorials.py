"""The README's runnable programs keep running: each is started as a user
would start it and must finish cleanly with its key output."""

import os
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
    losses = [float(line.split("loss")[1]) for line in out.splitlines() if line.startswith("trainer1:")]
    assert len(losses) >= 2 and losses[-1] < losses[0] / 4, out


@pytest.mark.timeout(240)
def test_torchscript_deployment_tutorial_serves_from_cpp():
    out = run(["tutorials/torchscript_deployment.py"], timeout=230)
    assert "server: joined a job of 4 workers" in out and "client: done" in out, out
    served = next(line for line in out.splitlines() if "server.forward(" in line).split(" = ")[1]
    local = next(line for line in out.splitlines() if "the same model run here gives" in line).split("gives ")[1]
    assert served == local, out


@pytest.mark.timeout(180)
def test_rl_cartpole_tutorial_runs_episodes():
    out = run(["tutorials/rl_cartpole.py", "--observers", "2", "--episodes", "20"], timeout=170)
    rewards = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("episode")]
    assert len(rewards) == 2 and all(r > 0 for r in rewards), out
