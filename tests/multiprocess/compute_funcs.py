"""Callees that compute: a small CNN, in Python and in TorchScript, and what
torch's intra-op thread setting is on the thread that runs them
(test_compute.py)."""

import threading
import warnings

import torch
import torch.nn.functional as F

SHAPES = {"w1": (16, 3, 3, 3), "b1": (16,), "w2": (32, 16, 3, 3), "b2": (32,), "wf": (10, 32 * 8 * 8), "bf": (10,)}


def cnn_weights():
    """The CNN's weights, the same in every process (their own generator)."""
    gen = torch.Generator().manual_seed(0)
    return {k: torch.randn(shape, generator=gen) * 0.1 for k, shape in SHAPES.items()}


def cnn_input(batch=16):
    """A batch of 32x32 RGB images, the same in every process."""
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated in 2.13

    @torch.jit.script
    def cnn_script(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                   wf: torch.Tensor, bf: torch.Tensor) -> torch.Tensor:
        """Two conv + ReLU + max-pool stages and a linear layer."""
        y = F.max_pool2d(F.relu(F.conv2d(x, w1, b1, padding=1)), 2)
        y = F.max_pool2d(F.relu(F.conv2d(y, w2, b2, padding=1)), 2)
        return F.linear(y.flatten(1), wf, bf)


_weights = {}


def cnn_python(x):
    """The same network as eager Python, weights made once per process."""
    if not _weights:
        _weights.update(cnn_weights())
    w = _weights
    with torch.no_grad():
        return cnn_script(x, w["w1"], w["b1"], w["w2"], w["b2"], w["wf"], w["bf"])


def this_thread_num_threads():
    """torch.get_num_threads() on the thread that runs the call."""
    return torch.get_num_threads()


def openmp_threads_here():
    """The OpenMP thread count of the thread that runs the call, as oneDNN's
    ops (LSTM, convolutions) read it: omp_get_max_threads(), which no torch
    call here initialises first (torch.get_num_threads() would)."""
    import ctypes
    import os

    gomp = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    return ctypes.CDLL(gomp if os.path.exists(gomp) else None).omp_get_max_threads()


def torch_setting():
    """torch's intra-op thread setting in this process: what a thread that has
    run no op yet gets (torch sets each thread's count at its first use)."""
    out = []
    t = threading.Thread(target=lambda: out.append(torch.get_num_threads()))
    t.start()
    t.join(10)
    return out[0]
