"""Builds torchrpc's native code against the installed torch.

Install (from the repository root, with torch==2.13.0 already installed):

    MAX_JOBS=2 pip install --no-build-isolation -e .

Build isolation would download a different (CUDA) torch, so it is off.

Two libraries come out of it:

- ``torchrpc/lib/libtorchrpc.so``: the whole core in pure C++ (transport,
  wire format, agent, script dispatch, the TorchScript ops of ``jit_ops/``).
  It links only c10 and torch_cpu, never Python, so a C++ program can load it
  beside libtorch and run saved TorchScript that calls torchrpc.
- ``torchrpc/_C``: the pybind11 module (``csrc/bindings``) and the only C++
  that touches the GIL (``csrc/python_fallback``); it links libtorchrpc.
"""

import glob
import os

from setuptools import Extension, find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths, library_paths

ROOT = os.path.dirname(os.path.abspath(__file__))
PYTHON_SIDE = ("bindings", "python_fallback")  # csrc/ folders built into _C
LIB = "torchrpc.lib.libtorchrpc"


def sources(folders, exclude=()):
    files = []
    for folder in folders:
        files += glob.glob(os.path.join(folder, "**", "*.cpp"), recursive=True)
    return sorted(f for f in files if not any(f.startswith(os.path.join("csrc", e)) for e in exclude))


class Build(BuildExtension):
    """Builds libtorchrpc first, as a plain shared library, then links _C to it."""

    def get_ext_filename(self, fullname):
        if fullname == LIB or fullname == LIB.rpartition(".")[2]:  # distutils passes either
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def copy_extensions_to_source(self):  # in-place builds (pip install -e)
        os.makedirs(os.path.join(ROOT, *LIB.split(".")[:-1]), exist_ok=True)
        super().copy_extensions_to_source()

    def build_extensions(self):
        lib = next(e for e in self.extensions if e.name == LIB)
        self.extensions.remove(lib)
        self.extensions.insert(0, lib)
        lib_dir = os.path.dirname(self.get_ext_fullpath(LIB))
        for ext in self.extensions[1:]:
            ext.library_dirs.append(lib_dir)
        super().build_extensions()


core = Extension(
    LIB,
    sources(["csrc", "jit_ops"], exclude=PYTHON_SIDE),
    include_dirs=[os.path.join(ROOT, "csrc"), ROOT] + include_paths(),
    library_dirs=library_paths(),
    libraries=["c10", "torch_cpu"],
    extra_compile_args=["-O2"],
    extra_link_args=["-Wl,-rpath,$ORIGIN/../../torch/lib", "-Wl,--no-undefined"],
    language="c++",
)

bindings = CppExtension(
    "torchrpc._C",
    sources([os.path.join("csrc", d) for d in PYTHON_SIDE]),
    include_dirs=[os.path.join(ROOT, "csrc"), ROOT],
    libraries=["torchrpc"],
    extra_compile_args=["-O2", "-fvisibility=hidden"],
    extra_link_args=["-Wl,-rpath,$ORIGIN/lib"],
)

setup(
    name="torchrpc",
    version="0.1.0",
    description="Remote procedure calls for PyTorch: the torch.distributed.rpc API, TorchScript-first",
    packages=find_packages(include=["torchrpc", "torchrpc.*"]),
    python_requires=">=3.10",
    install_requires=["torch==2.13.0", "cloudpickle"],
    ext_modules=[core, bindings],
    cmdclass={"build_ext": Build.with_options(use_ninja=True)},
)
