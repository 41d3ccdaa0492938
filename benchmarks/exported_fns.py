"""The exported programs of the ``exported`` job (torch.export, compiled by
AOTInductor; torchrpc only: torch.distributed.rpc has no such callee).

AOTInductor compiles a program in 10-40 s here, so a run compiles each
program once, before its jobs, in a fresh process with an empty cache:

    python -m benchmarks.exported_fns --dir DIR

exports TINY and BUSY, saves the programs (``DIR/<kind>-program.pt2``, which callers
load to call them directly) and compiles their packages into ``DIR/cache``;
it prints {"export_s", "compile_s": {kind: s}, "packages": {kind: path},
"package_kb": {kind: KB}} as JSON. The job's workers use that cache.
"""

import argparse
import json
import os
import time

import torch

#: Names the callee registers the packages under.
NAMES = {"tiny": "bench.exported_tiny", "busy": "bench.exported_busy"}
#: Layers of Busy: about as much CPU per call as remote_fns.busy_script.
BUSY_LAYERS = 400


class Tiny(torch.nn.Module):
    """x + 1 on a 2-element tensor: remote_fns.tiny_script, exported."""

    def forward(self, x):
        return x + 1


class Busy(torch.nn.Module):
    """CPU-bound on small tensors (one thread's work per op): BUSY_LAYERS
    of a 16x16 matmul and a tanh, which the compiler cannot fold away."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(16, 16, generator=torch.Generator().manual_seed(0)) / 4)

    def forward(self, x):
        for _ in range(BUSY_LAYERS):
            x = torch.tanh(x @ self.w)
        return x


def inputs(kind):
    """The arguments a call of `kind` takes."""
    return (torch.ones(2),) if kind == "tiny" else (torch.ones(16, 16) / 16,)


def cache_dir(folder):
    return os.path.join(folder, "cache")


def program_path(folder, kind):
    return os.path.join(folder, f"{kind}-program.pt2")


def load(folder, kind):
    """The saved program `kind`, as a fresh ExportedProgram object."""
    return torch.export.load(program_path(folder, kind))


def prepare(folder):
    """Exports, saves and compiles both programs; see the module's doc."""
    os.environ["TORCHRPC_AOTI_CACHE"] = cache_dir(folder)
    from torchrpc import exported

    out = {"export_s": {}, "compile_s": {}, "packages": {}, "package_kb": {}}
    for kind, module in (("tiny", Tiny()), ("busy", Busy())):
        start = time.perf_counter()
        ep = torch.export.export(module, inputs(kind))
        out["export_s"][kind] = time.perf_counter() - start
        torch.export.save(ep, program_path(folder, kind))
        start = time.perf_counter()
        path = exported.package(ep)
        out["compile_s"][kind] = time.perf_counter() - start
        out["packages"][kind] = path
        out["package_kb"][kind] = os.path.getsize(path) / 1024
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    print(json.dumps(prepare(args.dir)))


if __name__ == "__main__":
    main()
