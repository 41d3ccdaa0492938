"""Test hooks into libtorchrpc's internals (tests/csrc/hooks.cpp), built on
first use with torch's extension builder and kept in build/test_hooks. They
are not part of the shipped package: its bindings hold no test code."""

import functools
import glob
import hashlib
import os

import torch  # noqa: F401  (libtorch before the hooks)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.cache
def hooks():
    """The hooks module (builds it the first time; concurrent callers wait)."""
    import torchrpc  # loads libtorchrpc, whose symbols the hooks use
    from torch.utils import cpp_extension

    lib = os.path.join(os.path.dirname(torchrpc.__file__), "lib")
    # The hooks include the core's headers: a change there rebuilds them.
    headers = hashlib.sha1()
    for path in sorted(glob.glob(os.path.join(ROOT, "csrc", "**", "*.h"), recursive=True)):
        with open(path, "rb") as f:
            headers.update(f.read())
    build = os.path.join(ROOT, "build", "test_hooks")
    os.makedirs(build, exist_ok=True)
    return cpp_extension.load(
        name="torchrpc_test_hooks",
        sources=[os.path.join(ROOT, "tests", "csrc", "hooks.cpp")],
        extra_include_paths=[os.path.join(ROOT, "csrc"), ROOT],
        extra_cflags=["-O1", f"-DTORCHRPC_HEADERS={headers.hexdigest()[:12]}"],
        extra_ldflags=[f"-L{lib}", "-ltorchrpc", f"-Wl,-rpath,{lib}"],
        build_directory=build,
        verbose=False,
    )
