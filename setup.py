"""Builds torchrpc's native core against the installed torch.

Install (from the repository root, with torch==2.13.0 already installed):

    MAX_JOBS=2 pip install --no-build-isolation -e .

Build isolation would download a different (CUDA) torch, so it is off.
"""

import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def native_sources():
    files = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    files += sorted(glob.glob(os.path.join("jit_ops", "*.cpp")))
    return files


setup(
    name="torchrpc",
    version="0.1.0",
    description="Remote procedure calls for PyTorch: the torch.distributed.rpc API, TorchScript-first",
    packages=find_packages(include=["torchrpc", "torchrpc.*"]),
    python_requires=">=3.10",
    install_requires=["torch==2.13.0", "cloudpickle"],
    ext_modules=[
        CppExtension(
            "torchrpc._C",
            native_sources(),
            include_dirs=[os.path.join(ROOT, "csrc")],
            extra_compile_args=["-O2", "-fvisibility=hidden"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
