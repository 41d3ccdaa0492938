"""Exported programs (``torch.export``) as callees: each is compiled once with
AOTInductor into a package, cached on disk by a content hash, that callees
load in C++ and run without the GIL (csrc/script_dispatch/exported_program.h).

The package carries torchrpc's signature of the program in its metadata
(csrc/script_dispatch/exported_signature.h): argument names, dtypes, ranks,
static sizes and dynamic-shape bounds, and what it returns, so a callee checks
inputs and builds the schema callers are matched against without Python.

The cache is ``$TORCHRPC_AOTI_CACHE`` if set, else ``~/.cache/torchrpc/aoti``;
a package is ``<sha256>.pt2``, the hash covering the program, its weights, the
torch version and this signature format.
"""

import hashlib
import io
import json
import os
import platform
import tempfile
import threading
import warnings
import weakref
import zipfile

import torch

SIGNATURE_KEY = "torchrpc.signature"  # must match kSignatureKey in exported_signature.h
FORMAT = "torchrpc-exported/1"  # must match kSignatureFormat
CACHE_ENV = "TORCHRPC_AOTI_CACHE"

# torch dtype -> c10's name of it (what the C++ side parses); others go unchecked.
_DTYPES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}

_lock = threading.Lock()
_compiling = {}  # hash -> lock held while this process compiles it
_packages = weakref.WeakKeyDictionary()  # ExportedProgram -> package path


def cache_dir():
    """Where compiled packages are kept."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "torchrpc", "aoti")


def is_exported_program(obj):
    return isinstance(obj, torch.export.ExportedProgram)


def content_hash(ep):
    """sha256 of what the package depends on: the saved program and weights
    (not its example inputs, nor the save's random id), torch's version, the
    CPU's architecture and vector ISA, and the signature format."""
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    h = hashlib.sha256()
    # The package is native code for this torch and this CPU (-march=native).
    isa = torch.backends.cpu.get_cpu_capability()
    h.update(f"{FORMAT}\0{torch.__version__}\0{platform.machine()}\0{isa}\0".encode())
    with zipfile.ZipFile(buf) as z:
        for name in sorted(z.namelist()):
            if "/sample_inputs/" in name or name.endswith("serialization_id"):
                continue
            h.update(name.encode() + b"\0")
            h.update(z.read(name))
    return h.hexdigest()


def _dim(size, ranges):
    if isinstance(size, int):
        return str(size)
    expr = size.node.expr
    bounds = ranges.get(expr)
    if not getattr(expr, "is_Symbol", False) or bounds is None:
        return "*"  # a derived dim (2 * s0): unchecked here, the package computes with it
    hi = str(int(bounds.upper)) if bounds.upper.is_Integer else "inf"  # int_oo: unbounded
    return f"{expr}:{int(bounds.lower)}..{hi}"


def signature(ep):
    """torchrpc's signature of `ep` (the format of exported_signature.h).

    Raises:
        TypeError: an input or output is not a plain tensor (a nested
            structure, an int), which the package cannot be called with here.
    """
    in_spec, out_spec = ep.call_spec.in_spec, ep.call_spec.out_spec
    args_spec, kwargs_spec = in_spec.children()
    kw_names = list(kwargs_spec.context or [])
    for i, child in enumerate(list(args_spec.children()) + list(kwargs_spec.children())):
        if not child.is_leaf():
            raise TypeError(f"exported program input {i} is a {child.type.__name__}: torchrpc calls exported "
                            "programs whose inputs are tensors; export one that takes them one by one")
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    user_inputs = list(ep.graph_signature.user_inputs)
    names = list(getattr(ep.module_call_graph[0].signature, "forward_arg_names", None) or user_inputs)
    if len(names) != len(user_inputs):
        names = user_inputs
    records = [FORMAT]
    n_args = args_spec.num_children
    for i, node_name in enumerate(user_inputs):
        val = placeholders[node_name].meta.get("val")
        name = names[i] if i < n_args else kw_names[i - n_args]
        if not isinstance(val, torch.Tensor):
            raise TypeError(f"exported program input '{name}' is a {type(val).__name__}, not a tensor: torchrpc "
                            "calls exported programs whose inputs are all tensors")
        dims = [_dim(s, ep.range_constraints) for s in val.shape] or ["-"]
        records.append(" ".join(["arg" if i < n_args else "kwarg", name, _DTYPES.get(val.dtype, "*"),
                                 "contiguous" if val.is_contiguous() else "any", *dims]))
    records.append(_returns(out_spec))
    return ";".join(records)


def _returns(out_spec):
    if out_spec.is_leaf():
        return "returns tensor"
    if out_spec.type in (tuple, list) and all(c.is_leaf() for c in out_spec.children()):
        return f"returns {out_spec.type.__name__} {out_spec.num_children}"
    raise TypeError(f"an exported program returning {out_spec} is not supported: torchrpc calls exported "
                    "programs that return a tensor, or a flat tuple or list of tensors")


def package(ep):
    """The path of `ep`'s package, compiled now (about 30 s on a small CPU
    machine) unless the cache has it."""
    with _lock:
        path = _packages.get(ep)
    if path is not None and os.path.exists(path):
        return path
    sig = signature(ep)
    digest = content_hash(ep)
    folder = cache_dir()
    path = os.path.join(folder, digest + ".pt2")
    with _lock:
        gate = _compiling.setdefault(digest, threading.Lock())
    with gate:  # one compile per process; other processes may race, the last rename wins
        if not os.path.exists(path):
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=digest + ".", suffix=".pt2", dir=folder)
            os.close(fd)
            try:
                with warnings.catch_warnings():  # torch's own deprecations inside the compile, not the user's
                    warnings.simplefilter("ignore", FutureWarning)
                    torch._inductor.aoti_compile_and_package(
                        ep, package_path=tmp, inductor_configs={"aot_inductor.metadata": {SIGNATURE_KEY: sig}})
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    with _lock:
        _packages[ep] = path
    return path


def package_signature(path):
    """'' if the package at `path` carries torchrpc's signature (the callee
    reads it), else one made from its call spec: input count and names, what
    it returns; dtypes and shapes unchecked."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no AOTInductor package at {path!r}")
    try:
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if name.endswith("_metadata.json") and "/aotinductor/" in name:
                    if SIGNATURE_KEY in json.loads(z.read(name)):
                        return ""
    except zipfile.BadZipFile as err:
        raise ValueError(f"{path!r} is not an AOTInductor package (a .pt2 zip from "
                         f"torch._inductor.aoti_compile_and_package): {err}") from None
    loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
    in_spec, out_spec = (torch.utils._pytree.treespec_loads(s) for s in loader.get_call_spec())
    args_spec, kwargs_spec = in_spec.children()
    records = [FORMAT]
    records += [f"arg arg{i} * any ?" for i in range(args_spec.num_children)]
    records += [f"kwarg {k} * any ?" for k in (kwargs_spec.context or [])]
    records.append(_returns(out_spec))
    return ";".join(records)
