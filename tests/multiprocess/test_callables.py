"""Functions of the caller's __main__ script, sent as torch.distributed.rpc
sends them: by name, so the callee runs its own function of that name, with
its own globals (a program run on every worker, as torchrun starts it)."""

import json
import os
import subprocess
import sys

import pytest

from tests.multiprocess.cluster import ROOT, free_port

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "main_script.py")


@pytest.mark.timeout(120)
def test_main_script_functions_run_as_the_callees_own():
    init_method = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, SCRIPT, str(rank), init_method], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=100)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    line = next(line for line in outs[1].splitlines() if line.startswith("RESULT "))
    seen = json.loads(line[len("RESULT "):])
    # bump's globals hold a lock: it went by name (it failed to pickle before),
    # and counted on the callee's own counter.
    assert seen == {"bumps": [1, 2, 3], "callee_counter": 3, "is_update": True}, outs
