"""torchrpc's calls inside TorchScript.

Inside ``@torch.jit.script`` code, :func:`torchrpc.rpc_sync`,
:func:`torchrpc.rpc_async`, :func:`torchrpc.remote`,
:func:`torchrpc.autograd.backward` and :func:`torchrpc.autograd.get_gradients` compile to the script
functions below (the eager function is the key of torch's script cache), which
call the ops of ``jit_ops/`` in libtorchrpc with the callee's name:

    fut = torchrpc.rpc_async("worker1", "double", args=(x,))
    y = fut.wait()

``torch.jit.save`` stores these functions with the model, and with them the
text of :data:`LOAD_HINT`, so that loading the model where the ops are
missing fails with torch's ``Unknown builtin op: torchrpc::...`` pointing at
a line that says what to do (the tests check that the two agree).
"""

import warnings
from typing import Any, Dict, List

import torch

from torchrpc import _extension

# TorchScript takes no global strings: the functions spell the hint out.
LOAD_HINT = "torchrpc is not loaded: import torchrpc (Python) or load libtorchrpc.so (C++)"


def rpc_sync(to: str, func: str, args: Any = None, kwargs: Any = None, timeout: float = -1.0) -> Any:
    return torch.ops.torchrpc.rpc_sync(to, func, args, kwargs, timeout, "torchrpc is not loaded: import torchrpc (Python) or load libtorchrpc.so (C++)")


def rpc_async(to: str, func: str, args: Any = None, kwargs: Any = None,
              timeout: float = -1.0) -> torch.futures.Future[Any]:
    return torch.ops.torchrpc.rpc_async(to, func, args, kwargs, timeout, "torchrpc is not loaded: import torchrpc (Python) or load libtorchrpc.so (C++)")


def remote(to: str, func: str, args: Any = None, kwargs: Any = None,
           timeout: float = -1.0) -> "torch.classes.torchrpc.RRef":
    return torch.ops.torchrpc.remote(to, func, args, kwargs, timeout, "torchrpc is not loaded: import torchrpc (Python) or load libtorchrpc.so (C++)")


def get_gradients(context_id: int) -> Dict[torch.Tensor, torch.Tensor]:
    return torch.ops.torchrpc.get_gradients(context_id)


def dist_backward(context_id: int, roots: List[torch.Tensor], retain_graph: bool = False) -> None:
    torch.ops.torchrpc.dist_backward(context_id, roots, retain_graph)


def bind(eager, script_fn):
    """Makes TorchScript compile calls of the eager function `eager` to
    `script_fn`, so that code calling torchrpc can be scripted unchanged.
    Does nothing when the native core failed to load (the ops are missing;
    init_rpc reports why)."""
    if _extension._C is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's, in torch 2.13
        compiled = torch.jit.script(script_fn)
    torch.jit._state._set_jit_function_cache(eager, compiled)
