"""Builds tutorials/cpp_worker/cpp_worker.cpp into build/cpp_worker, linking
libtorchrpc (no Python) and libtorch; skips the build when it is up to date.

    .venv/bin/python tutorials/cpp_worker/build.py
"""

import os
import subprocess
import sys

import torch.utils.cpp_extension as ext

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "tutorials", "cpp_worker", "cpp_worker.cpp")
OUTPUT = os.path.join(ROOT, "build", "cpp_worker")
LIB_DIR = os.path.join(ROOT, "torchrpc", "lib")


def build():
    """Returns the path of the binary, building it if needed."""
    lib = os.path.join(LIB_DIR, "libtorchrpc.so")
    if not os.path.exists(lib):
        sys.exit(f"{lib} is missing: build torchrpc first (make build)")
    inputs = [SOURCE, lib]
    if os.path.exists(OUTPUT) and all(os.path.getmtime(OUTPUT) >= os.path.getmtime(p) for p in inputs):
        return OUTPUT
    os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
    torch_lib = ext.library_paths()[0]
    cmd = ["g++", "-std=c++20", "-O1", SOURCE, "-o", OUTPUT,
           "-I" + os.path.join(ROOT, "csrc"), "-I" + ROOT,
           *("-I" + p for p in ext.include_paths()),
           "-D_GLIBCXX_USE_CXX11_ABI=1",
           "-L" + LIB_DIR, "-L" + torch_lib, "-ltorchrpc", "-ltorch", "-ltorch_cpu", "-lc10",
           f"-Wl,-rpath,{LIB_DIR}:{torch_lib}"]
    print("building", os.path.relpath(OUTPUT, ROOT), flush=True)
    subprocess.run(cmd, check=True)
    return OUTPUT


if __name__ == "__main__":
    print(build())
