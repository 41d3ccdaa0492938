"""The suite's last resort against a hang (tests/conftest.py): a test that
pytest-timeout cannot interrupt, because its main thread is blocked outside
Python, ends the whole run with its stack instead of stalling CI."""

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BLOCKED = '''
import torch


def test_blocked_in_cpp():
    torch.futures.Future().wait()  # no one completes it, and torch's wait ignores signals
'''


def test_a_test_blocked_outside_python_ends_the_run_with_its_stack(tmp_path):
    test = tmp_path / "test_blocked.py"
    test.write_text(BLOCKED)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", str(test), "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "-o", "timeout=1", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, TORCHRPC_TEST_GRACE_S="1", PYTHONPATH=ROOT))
    took = time.monotonic() - started
    assert done.returncode == 3, done.stdout + done.stderr
    assert "test_blocked_in_cpp still runs 2 s after it began" in done.stderr
    assert "in test_blocked_in_cpp" in done.stderr  # its stack
    assert took < 30
