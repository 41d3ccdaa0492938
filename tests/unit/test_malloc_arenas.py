"""Each pool thread allocates from its own glibc malloc arena
(csrc/common/malloc_arenas.h): threads that run tensor ops in parallel never
wait for each other's malloc lock. glibc alone stops at 8 arenas per core."""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# More pool threads than glibc's default limit on this machine.
THREADS = 8 * len(os.sched_getaffinity(0)) + 8

# A one-worker job; prints how many arenas the process has once its pool runs
# (as soon as there are more than THREADS, or once none was added for 1 s).
PROGRAM = textwrap.dedent(f"""
    import ctypes, os, tempfile, time
    import torchrpc as rpc

    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p

    def arenas(path):
        out = ctypes.c_void_p(libc.fopen(path.encode(), b"w"))
        libc.malloc_info(0, out)
        libc.fclose(out)
        return open(path).read().count("<heap nr=")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "info.xml")
        rpc.init_rpc("solo", rank=0, world_size=1, rpc_backend_options=rpc.RpcOptions(
            num_worker_threads={THREADS}, init_method="file://" + path + ".store"))
        count, settled = arenas(path), time.monotonic() + 1  # threads allocate as they start
        while count <= {THREADS} and time.monotonic() < settled:
            time.sleep(0.05)
            if (now := arenas(path)) > count:
                count, settled = now, time.monotonic() + 1
        print("arenas", count)
        rpc.shutdown()
""")


def arenas(**env):
    env = {**{k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}, **env}
    proc = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split("arenas")[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas")
def test_every_pool_thread_gets_its_own_arena():
    assert arenas() > THREADS, f"{THREADS} pool threads share malloc arenas"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas")
def test_a_limit_the_user_set_is_kept():
    assert arenas(MALLOC_ARENA_MAX="4") <= 4
